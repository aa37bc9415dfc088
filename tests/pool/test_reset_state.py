"""What a reset puts back beyond names: interpreter switches, signals, process settings,
warnings, logging, and the options of numpy, pandas and matplotlib (real kernels).

Each case runs a cell that changes something as a lease's last cell, then reads it back in
the next lease on the same kernel: it must read as it did before (a fresh interpreter's
value), and the kernel must have been reused, not replaced.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from kernel_pool import KernelKind, Pool, PoolConfig
from tests.conftest import WorkerProcess
from tests.markers import quick_subset
from tests.pool.test_pool import assert_reset_path, run, settle, started
from tests.wire import run_ok


@dataclass(frozen=True)
class Case:
    change: str
    probe: str  # prints what the change changed


CASES = {
    "pickle reducers": Case(
        "import copyreg\ncopyreg.pickle(complex, lambda c: (str, ('HIJACKED',)))",
        "import pickle\nprint(pickle.loads(pickle.dumps(1 + 2j)))",
    ),
    "warnings filter": Case(
        "import warnings; warnings.simplefilter('error')",
        "import warnings; warnings.warn('careful'); print('went on')",
    ),
    "warnings display": Case(
        "import warnings; warnings.showwarning = lambda *a, **k: print('swallowed')",
        "import warnings; print(warnings.showwarning.__module__)",
    ),
    "stdlib functions replaced": Case(
        "import math, time, datetime, uuid\n"
        "math.sqrt = lambda x: -1.0; time.time = lambda: 0.0\n"
        "datetime.datetime = datetime.date; uuid.uuid4 = lambda: 'fixed'",
        "import math, time, datetime, uuid\n"
        "print(math.sqrt(4), time.time() > 1e9, datetime.datetime.__name__, type(uuid.uuid4()))",
    ),
    "unverified https": Case(
        "import ssl; ssl._create_default_https_context = ssl._create_unverified_context",
        "import ssl; print(ssl._create_default_https_context.__name__)",
    ),
    "stdlib attributes deleted": Case(
        "import math, json; del math.pi, json.loads",
        "import math, json; print(hasattr(math, 'pi'), hasattr(json, 'loads'))",
    ),
    "module values a cell set": Case(
        "import math, string\nmath.pi = 3\nstring.ascii_letters = 'x'\n"
        "setattr(string, 'added', 1)\nimport json as j\nj.added = 2",
        "import math, string, json\n"
        "print(math.pi, string.ascii_letters[:3], hasattr(string, 'added'), hasattr(json, 'added'))",
    ),
    "module values set through an alias or its namespace": Case(
        "import string\nm = string\nm.ascii_letters = 'x'\nvars(string)['added'] = 1\n"
        "string.__dict__.update(other=2)",
        "import string\n"
        "print(string.ascii_letters[:3], hasattr(string, 'added'), hasattr(string, 'other'))",
    ),
    "import finders a cell cached": Case(
        "import sys\nclass Spy:\n    def find_spec(self, *args):\n        return None\n"
        "for entry in list(sys.path):\n    sys.path_importer_cache[entry] = Spy()",
        "import sys\nprint(sorted({type(f).__name__ for f in sys.path_importer_cache.values()}))",
    ),
    "allocation tracing": Case(
        "import tracemalloc; tracemalloc.start(5)",
        "import tracemalloc; print(tracemalloc.is_tracing())",
    ),
    "class attributes a cell set": Case(
        "from string import Template\nTemplate.delimiter = '#'\n"
        "del Template.braceidpattern\nTemplate.extra = 1",
        "import string\nT = string.Template\n"
        "print(T.delimiter, hasattr(T, 'braceidpattern'), hasattr(T, 'extra'))",
    ),
    "logging basicConfig": Case(
        "import logging; logging.basicConfig(level=logging.DEBUG)",
        "import logging; print(logging.root.handlers, logging.root.level)",
    ),
    "logging disable": Case(
        "import logging; logging.disable(logging.CRITICAL)",
        "import logging; print(logging.root.manager.disable)",
    ),
    "a cell's own logger": Case(
        "import logging, sys; log = logging.getLogger('app'); log.setLevel(logging.INFO)\n"
        "log.addHandler(logging.StreamHandler(sys.stdout)); log.propagate = False",
        "import logging; log = logging.getLogger('app')\n"
        "print([type(h).__name__ for h in log.handlers], log.level, log.propagate, log.disabled)",
    ),
    "a library's logger": Case(
        "import logging; log = logging.getLogger('asyncio'); log.setLevel(logging.CRITICAL)\n"
        "log.addFilter(lambda record: False)",
        "import asyncio, logging; log = logging.getLogger('asyncio')\n"
        "print(log.level, log.filters)",
    ),
    "log record factory and logger class": Case(
        "import logging; logging.setLogRecordFactory(lambda *args, **kwargs: None)\n"
        "logging.setLoggerClass(type('CellLogger', (logging.Logger,), {}))",
        "import logging\n"
        "print(logging.getLogRecordFactory().__name__, logging.getLoggerClass().__name__)",
    ),
    "asyncio event loop policy": Case(
        "import asyncio\n"
        "class CellPolicy(asyncio.DefaultEventLoopPolicy): pass\n"
        "asyncio.set_event_loop_policy(CellPolicy())",
        "import asyncio; print(type(asyncio.get_event_loop_policy()).__name__)",
    ),
    "logging dictConfig": Case(  # disables every logger that existed before it
        "import logging.config; logging.getLogger('made.before')\n"
        "logging.config.dictConfig({'version': 1})",
        "import logging\n"
        "print(sorted(name for name, logger in logging.root.manager.loggerDict.items()\n"
        "             if isinstance(logger, logging.Logger) and logger.disabled))",
    ),
    "recursion limit": Case(
        "import sys; sys.setrecursionlimit(60)", "import sys; print(sys.getrecursionlimit())"
    ),
    "trace function": Case(
        "import sys, threading; sys.settrace(lambda *a: None)\nthreading.settrace(lambda *a: None)",
        "import sys, threading; print(sys.gettrace(), threading.gettrace())",
    ),
    "garbage collector": Case(
        "import gc; gc.disable(); gc.set_threshold(5, 5, 5)",
        "import gc; print(gc.isenabled(), gc.get_threshold())",
    ),
    "switch interval and int digits": Case(
        "import sys; sys.setswitchinterval(0.5); sys.set_int_max_str_digits(700)",
        "import sys; print(sys.getswitchinterval(), sys.get_int_max_str_digits())",
    ),
    "signal handler": Case(
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGUSR1, lambda *a: None)",
        "import signal; print(signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGUSR1))",
    ),
    "alarm left running": Case(
        "import signal; signal.setitimer(signal.ITIMER_REAL, 60)",
        "import signal; print(signal.getitimer(signal.ITIMER_REAL))",
    ),
    "blocked signals": Case(
        "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})",
        "import signal; print(signal.pthread_sigmask(signal.SIG_BLOCK, []))",
    ),
    "umask": Case(
        "import os; os.umask(0o077)", "import os; m = os.umask(0o022); os.umask(m); print(m)"
    ),
    "open-files soft limit": Case(
        "import resource; soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 4096) - 1, hard))",
        "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))",
    ),
    "cpu affinity": Case(
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})",
        "import os; print(os.sched_getaffinity(0))",
    ),
    "time zone": Case(
        "import os, time; os.environ['TZ'] = 'Asia/Tokyo'; time.tzset()",
        "import time; print(time.tzname, time.timezone)",
    ),
    "locale": Case(
        "import locale; locale.setlocale(locale.LC_NUMERIC, 'C.UTF-8')",
        "import locale; print(locale.setlocale(locale.LC_ALL))",
    ),
    "socket timeout": Case(
        "import socket; socket.setdefaulttimeout(1.5)",
        "import socket; print(socket.getdefaulttimeout())",
    ),
    "decimal context": Case(
        "import decimal; decimal.getcontext().prec = 5; decimal.Decimal(1) / 3",
        "import decimal; print(decimal.getcontext())",
    ),
    "temporary directory and thread stack size": Case(
        "import tempfile, threading; tempfile.tempdir = '/nonexistent'\n"
        "threading.stack_size(512 * 1024)",
        "import tempfile, threading; print(tempfile.gettempdir(), threading.stack_size())",
    ),
    "an equal stand-in for os.environ": Case(
        "import os; os.environ = dict(os.environ)", "import os; print(type(os.environ).__name__)"
    ),
    "argv and hooks": Case(
        "import sys, threading; sys.argv = ['cell']; sys.unraisablehook = print\n"
        "threading.excepthook = print",
        "import sys, threading; print(sys.argv, sys.unraisablehook, threading.excepthook)",
    ),
}

_FIGURE_PRINTERS = (  # each display format's figure printer: its function and options
    "import matplotlib.pyplot as plt; from matplotlib.figure import Figure\n"
    "plt.plot([1, 2]); plt.show()\n"
    "formatters = get_ipython().display_formatter.formatters\n"
    "for mime in sorted(formatters):\n"
    "    printer = formatters[mime].type_printers.get(Figure)\n"
    "    print(mime, getattr(printer, 'func', printer), getattr(printer, 'keywords', None))"
)
KERNEL_CASES = {  # switches only a kernel has: IPython's, the inline backend's
    "a file and a folder left in the kernel's temp folder": Case(
        "import os, tempfile\nfolder = tempfile.gettempdir()\n"
        "open(os.path.join(folder, 'left-behind.txt'), 'w').write('x')\n"
        "os.makedirs(os.path.join(folder, 'a-folder', 'inside'))",
        "import os, tempfile\nprint(sorted(os.listdir(tempfile.gettempdir())))",
    ),
    "bytecode writing": Case(
        "import sys; sys.dont_write_bytecode = not sys.dont_write_bytecode",
        "import sys; print(sys.dont_write_bytecode)",
    ),
    "an atexit callback": Case(  # (unregistered, atexit lets go of it)
        "import atexit, sys, weakref\nclass Bye:\n    def __call__(self):\n        print('bye')\n"
        "bye = Bye()\natexit.register(bye)\nsys._kernel_pool_test_exit = weakref.ref(bye)",
        "import gc, sys\ngc.collect()\n"
        "print(getattr(sys, '_kernel_pool_test_exit', lambda: None)() is None)",
    ),
    "the signal wakeup fd": Case(
        "import os, signal\nread, write = os.pipe()\nos.set_blocking(write, False)\n"
        "signal.set_wakeup_fd(write)",
        "import signal\nfd = signal.set_wakeup_fd(-1)\nsignal.set_wakeup_fd(fd)\nprint(fd)",
    ),
    "traceback mode": Case(
        "get_ipython().run_line_magic('xmode', 'Verbose')",
        "print(get_ipython().InteractiveTB.mode)",
    ),
    "float precision": Case(
        "get_ipython().run_line_magic('precision', '2')",
        "print(get_ipython().display_formatter.formatters['text/plain'].float_format)",
    ),
    "autocall": Case(
        "get_ipython().run_line_magic('autocall', '1')", "print(get_ipython().autocall)"
    ),
    "autoawait": Case(  # a later cell's top-level await failed: 'await' outside function
        "get_ipython().run_line_magic('autoawait', 'False')",
        "print(get_ipython().autoawait)",
    ),
    "pdb on errors": Case(  # a later failing cell printed a debugger prompt into its stdout
        "get_ipython().run_line_magic('pdb', 'on')", "print(get_ipython().call_pdb)"
    ),
    "automagic and expression display": Case(
        "get_ipython().run_line_magic('automagic', 'off')\n"
        "get_ipython().ast_node_interactivity = 'all'",
        "print(get_ipython().automagic, get_ipython().ast_node_interactivity)",
    ),
    "cell log": Case(  # %logstart wrote every later request's code to a file
        "import os\nget_ipython().run_line_magic('logstart', '-o -q ' + os.devnull + ' over')",
        "print(get_ipython().logger.log_active)",
    ),
    "a printer for a builtin type": Case(
        "get_ipython().display_formatter.formatters['text/plain']"
        ".for_type(float, lambda o, p, cycle: p.text('FLOAT!'))",
        "plain = get_ipython().display_formatter.formatters['text/plain']\n"
        "print(plain.lookup_by_type(float).__qualname__)",
    ),
    "formatter replaced or disabled": Case(  # rich's pretty.install() replaces text/plain
        "formatters = get_ipython().display_formatter.formatters\n"
        "formatters['text/plain'] = object(); formatters['text/html'].enabled = False",
        "formatters = get_ipython().display_formatter.formatters\n"
        "print(type(formatters['text/plain']).__name__, formatters['text/html'].enabled)",
    ),
    "figure formats set by the older call": Case(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\n"
        "from matplotlib_inline.backend_inline import set_matplotlib_formats\n"
        "set_matplotlib_formats('svg')",
        _FIGURE_PRINTERS,
    ),
    "figure formats: retina with print options": Case(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\n"
        "from matplotlib_inline.backend_inline import set_matplotlib_formats\n"
        "set_matplotlib_formats('retina', dpi=20)",
        _FIGURE_PRINTERS,
    ),
    "figure formats: none at all": Case(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\n"
        "from matplotlib_inline.backend_inline import set_matplotlib_formats\n"
        "set_matplotlib_formats()",
        _FIGURE_PRINTERS,
    ),
    "hidden names": Case(
        "get_ipython().user_ns_hidden['extra'] = 1",
        "print(sorted(k for k in get_ipython().user_ns_hidden if not k.lstrip('_i').isdigit()))",
    ),
    "matplotlib backend": Case(
        "import matplotlib; matplotlib.use('Agg')",
        "import matplotlib, matplotlib.pyplot as plt\n"
        "plt.figure(); plt.close('all')\n"  # the backend is chosen (inline) on the first figure
        "print(matplotlib.get_backend(), matplotlib.is_interactive())",
    ),
    "matplotlib interactive mode": Case(
        "import matplotlib.pyplot as plt; plt.ioff()",
        "import matplotlib, matplotlib.pyplot as plt\n"
        "plt.figure(); plt.close('all')\n"
        "print(matplotlib.get_backend(), matplotlib.is_interactive())",
    ),
    "interactive mode set as pyplot is first imported": Case(  # the backend loads in ion()
        "import matplotlib.pyplot as plt; plt.ion()",
        "import matplotlib; print(matplotlib.is_interactive())",
    ),
    "event loop debug mode": Case(
        "import asyncio; loop = asyncio.get_running_loop(); loop.set_debug(True)\n"
        "loop.slow_callback_duration = 9.0; loop.set_exception_handler(lambda *a: None)",
        "import asyncio; loop = asyncio.get_running_loop()\n"
        "print(loop.get_debug(), loop.slow_callback_duration, loop.get_exception_handler())",
    ),
    "environment set under os.environ": Case(  # reached every later request's processes
        "import os\nos.putenv('KERNEL_POOL_PUT', 'x'); os.unsetenv('HOME')",
        "import subprocess\n"
        "print(subprocess.run('echo $KERNEL_POOL_PUT/$HOME', shell=True, text=True,\n"
        "                     capture_output=True).stdout, end='')",
    ),
    "sqlite3 adapters and converters": Case(
        "import sqlite3, json\nsqlite3.register_converter('JSON', json.loads)\n"
        "sqlite3.register_adapter(dict, json.dumps)",
        "import sqlite3\n"
        "db = sqlite3.connect(':memory:', detect_types=sqlite3.PARSE_DECLTYPES)\n"
        "db.execute('create table t (v JSON)'); db.execute(\"insert into t values ('[1]')\")\n"
        "print(repr(db.execute('select v from t').fetchone()[0]), len(sqlite3.adapters))",
    ),
    "multiprocessing start method": Case(  # set_start_method failed in every later request
        "import multiprocessing\nmultiprocessing.set_start_method('spawn', force=True)",
        "import multiprocessing\nprint(multiprocessing.get_start_method(allow_none=True))",
    ),
    "urllib opener": Case(  # its headers (credentials) went with every later urlopen
        "import urllib.request\nopener = urllib.request.build_opener()\n"
        "opener.addheaders = [('Authorization', 'Bearer secret')]\n"
        "urllib.request.install_opener(opener)",
        "import urllib.request\nprint(urllib.request._opener)",
    ),
    "event loop task factory": Case(  # one using the cell's names wedged later requests
        "import asyncio\n"
        "def factory(loop, coro, **kwargs):\n    return asyncio.Task(coro, loop=loop, **kwargs)\n"
        "asyncio.get_running_loop().set_task_factory(factory)",
        "import asyncio; print(asyncio.get_running_loop().get_task_factory())",
    ),
    "async generator hooks": Case(
        "import sys\nseen = []\nsys.set_asyncgen_hooks(firstiter=seen.append)",
        "import sys; print(getattr(sys.get_asyncgen_hooks().firstiter, '__qualname__', None))",
    ),
    "garbage collector callbacks": Case(
        "import gc\nseen = []\ngc.callbacks.append(lambda phase, info: seen.append(phase))",
        "import gc; print(len(gc.callbacks))",
    ),
    "inline figure formats": Case(
        "get_ipython().run_line_magic('config', \"InlineBackend.figure_formats = ['svg']\")",
        "import matplotlib.pyplot as plt; from matplotlib.figure import Figure\n"
        "plt.plot([1, 2]); plt.show()\n"  # the backend configures itself on the first figure
        "printers = get_ipython().display_formatter.formatters\n"
        "print(Figure in printers['image/png'].type_printers,\n"
        "      Figure in printers['image/svg+xml'].type_printers)",
    ),
}

MONITORING_TOOL = Case(  # sys.monitoring (3.12+): see check_monitoring_tool
    "import sys\nm = sys.monitoring\nm.use_tool_id(3, 'cell profiler')\n"
    "m.register_callback(3, m.events.PY_START, lambda *a: None)\n"
    "m.set_events(3, m.events.PY_START)",
    "import sys\nm = sys.monitoring\nprint(m.get_tool(3), m.get_events(3))",
)


async def check_monitoring_tool(pool: Pool) -> None:
    """A ``sys.monitoring`` tool a cell took is given back: freed in place where the
    kernel's Python can clear a tool (``clear_tool_id``, 3.14+), else the kernel is retired
    (a tool's local events on code objects cannot be found to clear); either way the next
    lease finds the tool free."""
    can_clear = await probe_once(
        pool, "import sys\nprint(hasattr(sys.monitoring, 'clear_tool_id'))"
    )
    before = await probe_once(pool, MONITORING_TOOL.probe)
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, MONITORING_TOOL.change, last=True)
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert (lease.kernel_id == first) is (can_clear == "True\n")
        assert await run(lease, MONITORING_TOOL.probe) == before == "None 0\n"


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    async with started(PoolConfig(size=1)) as p:
        yield p


async def change_then_probe(pool: Pool, change: str, probe: str, *, last: bool = True) -> str:
    """Run ``change`` as a lease's cell, then ``probe`` in the next lease, on the same kernel."""
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, change, last=last)
    await settle(pool, idle=1)
    assert_reset_path(pool, last)
    async with pool.lease() as lease:
        assert lease.kernel_id == first, "the kernel was replaced, not reset"
        return await run(lease, probe)


async def probe_once(pool: Pool, probe: str) -> str:
    async with pool.lease() as lease:
        return await run(lease, probe)


# one case of each kind of state in the quick loop; the whole matrix in the full run
QUICK_CASES = (
    "warnings filter",
    "signal handler",
    "module values a cell set",
    "a library's logger",
    "matplotlib backend",
)


@pytest.mark.parametrize("name", quick_subset([*CASES, *KERNEL_CASES], QUICK_CASES))
async def test_reset_puts_back_what_a_cell_changed(pool: Pool, name: str) -> None:
    case = CASES.get(name) or KERNEL_CASES[name]
    before = await probe_once(pool, case.probe)
    after = await change_then_probe(pool, case.change, case.probe)
    assert after == before
    if name in KERNEL_CASES:  # (the others are checked in a plain interpreter, below)
        changed = await probe_once(pool, f"{case.change}\n{case.probe}")
        assert changed != before  # the change does change what the probe reads


@pytest.mark.skipif(sys.version_info < (3, 12), reason="sys.monitoring is new in 3.12")
async def test_a_monitoring_tool_a_cell_took_is_given_back(pool: Pool) -> None:
    await check_monitoring_tool(pool)


@pytest.mark.parametrize("name", ["warnings filter", "recursion limit", "decimal context"])
async def test_the_full_reset_puts_them_back_too(pool: Pool, name: str) -> None:
    """The reset that runs as an execution of its own (not the last cell's) does the same."""
    case = CASES[name]
    before = await probe_once(pool, case.probe)
    assert pool.stats().inline_resets == 0
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, case.change)
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id == first
        assert await run(lease, case.probe) == before


@pytest.mark.parametrize(
    "cell",
    [
        "import asyncio\nresult = await asyncio.to_thread(sum, [1, 2])",
        "import asyncio\nresult = await asyncio.get_running_loop().run_in_executor(None, sum, [1])",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(0.05,)).start()",
    ],
    ids=["to_thread", "default executor", "thread ending just after"],
)
async def test_threads_that_end_with_the_cell_keep_the_kernel(pool: Pool, cell: str) -> None:
    """The event loop's default executor (``to_thread``) and a thread ending a moment after
    the cell are not a thread left running: the kernel was replaced for each."""
    probe = "import threading; print(threading.active_count())"
    before = await probe_once(pool, probe)
    assert await change_then_probe(pool, cell, probe) == before
    assert not any(pool.stats().retirements.values()), pool.stats()


async def test_to_thread_keeps_the_kernel_after_a_kernel_init_that_used_it() -> None:
    """A kernel-init's ``to_thread`` (it runs as a cell, on the kernel's loop) made the loop's
    default executor, whose idle threads then counted as the baseline's and a cell's new ones
    as left running."""
    kernel_init = "import asyncio\nawait asyncio.to_thread(sum, [1])\n"
    async with started(PoolConfig(size=1, kind=KernelKind(kernel_init=kernel_init))) as pool:
        cell = (
            "import asyncio, time\n"
            "await asyncio.gather(*(asyncio.to_thread(time.sleep, 0.05) for _ in range(4)))"
        )
        probe = "import threading; print(threading.active_count())"
        before = await probe_once(pool, probe)
        assert await change_then_probe(pool, cell, probe) == before
        assert not any(pool.stats().retirements.values()), pool.stats()


async def test_a_warning_is_shown_again_in_the_next_request(pool: Pool, tmp_path: Path) -> None:
    """A fresh interpreter shows a library's warning once per process: once per request here."""
    (tmp_path / "noisy_lib.py").write_text(
        "import warnings\ndef work():\n    warnings.warn('noisy library', UserWarning)\n"
    )
    cell = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import noisy_lib; noisy_lib.work()"
    for _ in range(2):
        async with pool.lease() as lease:
            assert "noisy library" in await run(lease, cell, last=True)
        await settle(pool, idle=1)


async def test_filters_a_module_adds_as_it_is_imported_stay(pool: Pool, tmp_path: Path) -> None:
    (tmp_path / "filtering_lib.py").write_text(
        "import warnings\n"
        "warnings.filterwarnings('ignore', message='import-time filter')\n"
        "warnings.filterwarnings('ignore', message='import-time filter', append=True)  # no-op\n"
        "warnings.filterwarnings('ignore', message='appended at import', append=True)\n"
    )
    probe = (
        "import warnings\nprint([(f[0], getattr(f[1], 'pattern', None)) for f in warnings.filters])"
    )
    before = await probe_once(pool, probe)
    assert before.startswith("[(") and "import-time filter" not in before
    change = (  # the cell's own filters: one at the front, one at the end, around the import
        "import sys, warnings\n"
        "warnings.filterwarnings('error', message='set by the cell')\n"
        "warnings.filterwarnings('error', message='appended by the cell', append=True)\n"
        f"sys.path.insert(0, {str(tmp_path)!r}); import filtering_lib\n"
    )
    after = await change_then_probe(pool, change, probe)
    expected = (
        f"[('ignore', 'import-time filter'), {before[1:-2]}, ('ignore', 'appended at import')]"
    )
    assert after == expected + "\n"
    async with pool.lease() as lease:
        out = await run(lease, (
            "import warnings\n"
            "warnings.warn('import-time filter'); warnings.warn('set by the cell'); print('ok')"
        ))  # fmt: skip
    assert "UserWarning: import-time filter" not in out  # the module's filter holds
    assert "UserWarning: set by the cell" in out and "ok\n" in out  # the cell's is gone


async def test_sqlite3_converters_a_module_registers_as_it_is_imported_stay(
    pool: Pool, tmp_path: Path
) -> None:
    (tmp_path / "sqlite_lib.py").write_text(
        "import sqlite3\nsqlite3.register_converter('POINT', lambda raw: ('point', raw))\n"
    )
    probe = "import sqlite3\nprint(sorted(sqlite3.converters))"
    change = (
        "import sqlite3, sys\nsqlite3.register_converter('CELL', bytes.upper)\n"
        f"sys.path.insert(0, {str(tmp_path)!r}); import sqlite_lib\n"
    )
    before = ast.literal_eval(await probe_once(pool, probe))
    after = ast.literal_eval(await change_then_probe(pool, change, probe))
    assert after == sorted([*before, "POINT"])  # the cell's CELL is gone, the module's stays


async def test_what_a_module_sets_on_its_logger_as_it_is_imported_stays(
    pool: Pool, tmp_path: Path
) -> None:
    """Its import-time configuration is its baseline; the importing cell's changes are not."""
    (tmp_path / "logging_lib.py").write_text(
        "import logging\n"
        "log = logging.getLogger('logging_lib')\n"
        "log.addHandler(logging.NullHandler()); log.setLevel(logging.WARNING)\n"
        "log.propagate = False\n"
        "logging.getLogger('asyncio').setLevel(logging.ERROR)  # an existing logger, at import\n"
        "def records(*args, **kwargs): return logging.LogRecord(*args, **kwargs)\n"
        "logging.setLogRecordFactory(records)\n"
    )
    change = (
        f"import logging, sys; sys.path.insert(0, {str(tmp_path)!r}); import logging_lib\n"
        "log = logging.getLogger('logging_lib'); log.handlers.clear(); log.setLevel(logging.DEBUG)\n"
        "log.propagate = True; log.disabled = True\n"
        "logging.getLogger('asyncio').setLevel(logging.DEBUG)\n"
    )
    probe = (
        "import logging; log = logging.getLogger('logging_lib')\n"
        "print([type(h).__name__ for h in log.handlers], log.level, log.propagate, log.disabled,\n"
        "      logging.getLogger('asyncio').level, logging.getLogRecordFactory().__name__)"
    )
    after = await change_then_probe(pool, change, probe)
    assert after == "['NullHandler'] 30 False False 40 records\n"


async def test_a_handler_added_in_every_request_prints_once(pool: Pool) -> None:
    """A cell that adds a handler to its logger: each request prints its record once, not
    once more for every earlier request that ran on the kernel."""
    cell = (
        "import logging, sys\n"
        "log = logging.getLogger('__main__'); log.addHandler(logging.StreamHandler(sys.stdout))\n"
        "log.warning('logged')\n"
    )
    kernels = set()
    for _ in range(3):
        async with pool.lease() as lease:
            kernels.add(lease.kernel_id)
            assert await run(lease, cell, last=True) == "logged\n"
        await settle(pool, idle=1)
    assert len(kernels) == 1  # one kernel, reset each time


@pytest.mark.slow
async def test_a_library_imported_and_changed_in_one_cell_is_put_back(pool: Pool) -> None:
    """Settings are recorded as the library's import ends, before the cell changes them."""
    import matplotlib
    import numpy
    import pandas

    change = (
        "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
        "np.set_printoptions(precision=2); np.seterr(all='raise')\n"
        "pd.set_option('display.max_rows', 5)\n"
        "plt.style.use('dark_background'); plt.rcParams['lines.linewidth'] = 9\n"
    )
    probe = (
        "import numpy as np, pandas as pd, matplotlib.pyplot as plt\n"
        "print(np.get_printoptions()['precision'], np.geterr()['divide'],\n"
        "      pd.get_option('display.max_rows'), plt.rcParams['figure.facecolor'],\n"
        "      plt.rcParams['lines.linewidth'])\n"
    )
    after = await change_then_probe(pool, change, probe)
    defaults = (
        numpy.get_printoptions()["precision"],
        numpy.geterr()["divide"],
        pandas.get_option("display.max_rows"),
        matplotlib.rcParamsDefault["figure.facecolor"],
        matplotlib.rcParamsDefault["lines.linewidth"],
    )
    assert after == " ".join(str(value) for value in defaults) + "\n"


async def test_a_module_a_cell_imported_and_patched_retires_the_kernel(pool: Pool) -> None:
    """Its namespace could not be recorded before the cell: the kernel is replaced."""
    probe = "import sys\nprint('colorsys' in sys.modules)"
    assert await probe_once(pool, probe) == "False\n"  # the cell below is its first import
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, "import colorsys\ncolorsys.ONE_THIRD = 0", last=True)
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id != first
        assert await run(lease, "import colorsys\nprint(colorsys.ONE_THIRD)") == f"{1 / 3}\n"


async def test_descriptors_a_cell_left_open_retire_the_kernel(pool: Pool) -> None:
    """Raw descriptors a cell never closed would pile up request after request."""
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, "import os\nkept = [os.open(os.devnull, os.O_RDONLY) for _ in range(100)]")
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id != first
    async with pool.lease() as lease:  # a few are no reason
        second = lease.kernel_id
        await run(lease, "import os\nkept = [os.open(os.devnull, os.O_RDONLY) for _ in range(5)]")
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id == second


async def test_seeded_generators_are_reseeded(pool: Pool) -> None:
    import numpy

    change = "import random, numpy as np; random.seed(0); np.random.seed(0)"
    probe = "import random, numpy as np; print(random.random(), np.random.random())"
    after = await change_then_probe(pool, change, probe)
    seeded = f"{random.Random(0).random()} {numpy.random.RandomState(0).random_sample()}\n"
    assert after != seeded
    assert str(random.Random(0).random()) not in after


async def test_lowered_priority_is_undone_or_the_kernel_replaced(pool: Pool) -> None:
    """Only a privileged kernel can raise its priority again; otherwise it is retired."""
    probe = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"
    before = await probe_once(pool, probe)
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, "import os; os.nice(5)", last=True)
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert await run(lease, probe) == before
        replaced = lease.kernel_id != first
    assert replaced == (os.geteuid() != 0)
    assert pool.stats().retirements["failed_reset"] == int(replaced)


async def test_a_timer_a_cell_left_does_not_fire_in_a_later_request(pool: Pool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, (
            "import signal\n"
            "signal.signal(signal.SIGALRM, signal.SIG_DFL)\n"  # the default action ends a process
            "signal.setitimer(signal.ITIMER_REAL, 0.3)\n"
        ), last=True)  # fmt: skip
    await settle(pool, idle=1)
    await asyncio.sleep(0.6)  # time passing is the point: past the timer, which must not fire
    async with pool.lease() as lease:
        assert lease.kernel_id == first
        assert await run(lease, "print('alive')") == "alive\n"


@pytest.mark.slow
def test_the_cases_change_what_they_probe_here() -> None:
    """Sanity of the table: each change alters its probe's answer in a plain interpreter."""
    for name, case in CASES.items():
        if name == "cpu affinity" and len(os.sched_getaffinity(0)) < 2:
            continue
        script = f"{case.probe}\n{case.change}\n{case.probe}\n"
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
        )
        lines = out.stdout.splitlines()
        assert out.returncode == 0 or name == "warnings filter", (name, out.stderr)
        if name != "warnings filter":
            assert len(lines) == 2 and lines[0] != lines[1], (name, out.stdout, out.stderr)


@pytest.mark.slow
def test_over_http_the_next_request_starts_from_the_baseline(solo_worker: WorkerProcess) -> None:
    """Through the worker (one kernel): a cell's warning filter, recursion limit, pandas
    option, logging configuration and logger handler are gone in the next request, whose
    warning is shown, whose record is printed once and whose cell runs."""
    log_once = (
        "import logging, sys\n"
        "logging.getLogger('app').addHandler(logging.StreamHandler(sys.stdout))\n"
        "logging.getLogger('app').warning('logged')\n"
    )
    with httpx.Client(base_url=solo_worker.url, timeout=120) as client:
        run_ok(client, (
            "import sys, warnings, pandas as pd, logging.config\n"
            "warnings.simplefilter('error'); sys.setrecursionlimit(80)\n"
            "pd.set_option('display.max_rows', 3)\n"
            "logging.config.dictConfig({'version': 1})\n" + log_once
        ))  # fmt: skip
        bundle = run_ok(client, (
            "import sys, warnings, pandas as pd\n"
            "warnings.warn('careful')\n"
            "limit, rows = sys.getrecursionlimit(), pd.get_option('display.max_rows')\n"
            + log_once +
            "disabled = [name for name, logger in logging.root.manager.loggerDict.items()\n"
            "            if isinstance(logger, logging.Logger) and logger.disabled]\n"
        ))  # fmt: skip
    assert "UserWarning: careful" in bundle.stderr()
    assert bundle.stdout() == "logged\n"
    assert bundle.variables["disabled"]["preview"] == []
    assert bundle.variables["limit"]["preview"] == sys.getrecursionlimit()
    import pandas

    assert bundle.variables["rows"]["preview"] == pandas.get_option("display.max_rows")


_DAEMON = (  # forks, and the child starts its own session: a daemon
    "import os, time\n"
    "if os.fork():\n    os._exit(0)\n"
    "os.setsid()\n"
    "for i in range(40):\n    os.write(1, b'LEAKED\\n'); time.sleep(0.05)\n"
)


@pytest.mark.parametrize(
    "escape",
    [
        "os.system('(for i in $(seq 40); do echo LEAKED; sleep 0.05; done) &')",
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {_DAEMON!r}])",
    ],
    ids=["background job", "daemon in its own session"],
)
@pytest.mark.slow
def test_a_process_whose_parent_exited_is_found_and_its_output_stays_out(
    solo_worker: WorkerProcess, escape: str
) -> None:
    """A shell's background job outlives the shell: it ran on in the kernel's process group,
    unseen by the check after the request, and printed into later requests' stdout."""
    probe = "import os, time\ntime.sleep(0.5)\nprint('probe', os.getpid())"
    with httpx.Client(base_url=solo_worker.url, timeout=120) as client:
        first = run_ok(client, f"import os\nbefore = os.getpid()\n{escape}")
        second = run_ok(client, probe)
        third = run_ok(client, probe)
    assert "LEAKED" not in second.stdout() + third.stdout()
    assert second.stdout() != f"probe {first.variables['before']['preview']}\n"  # replaced
    deadline = time.monotonic() + 10
    while any("LEAKED" in " ".join(p.cmdline()) or _loops_leaked(p) for p in _mine()):
        assert time.monotonic() < deadline, "the job outlived its kernel"
        time.sleep(0.1)


def _mine() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "echo LEAKED" in " ".join(proc.info["cmdline"] or ()):
                found.append(proc)
    return found


def _loops_leaked(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    return False


@pytest.mark.slow
def test_a_module_a_cell_wrote_is_imported_afresh_by_the_next(solo_worker: WorkerProcess) -> None:
    """A helper the cell writes into its working directory and imports is the next request's
    own file, not the last one's from a deleted folder; import caches keep no finder for it."""
    cell = (
        "import sys\n"
        "open('helpers.py', 'w').write(f'X = {version}\\n')\n"
        "import helpers\n"
        "x = helpers.X\n"
        "import os; here = os.path.dirname(os.getcwd()); runs = os.path.dirname(here)\n"
        "stale = [k for k in sys.path_importer_cache if k.startswith(runs) and here not in k]\n"
    )
    with httpx.Client(base_url=solo_worker.url, timeout=120) as client:
        seen = [
            run_ok(client, cell.replace("{version}", str(version))).variables
            for version in (1, 2, 3)
        ]
    assert [v["x"]["preview"] for v in seen] == [1, 2, 3]
    assert [v["stale"]["preview"] for v in seen] == [[], [], []]  # no earlier run's folder


async def test_a_traceback_dump_a_cell_timed_does_not_end_a_later_request(pool: Pool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, (
            "import faulthandler, os\n"
            "faulthandler.dump_traceback_later(0.3, exit=True, file=open(os.devnull, 'w'))\n"
        ))  # fmt: skip
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id == first
        assert await run(lease, "import time; time.sleep(0.6); print('alive')") == "alive\n"


async def test_an_idle_kernel_still_ignores_sigint_after_a_reset(pool: Pool) -> None:
    """ipykernel ignores SIGINT between executions: a reset (recorded during an execution,
    where SIGINT interrupts) must not leave the interrupting handler installed while idle."""
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, "x = 1", last=True)
    await settle(pool, idle=1)
    os.kill(pool.kernel_pids()[first], signal.SIGINT)
    await asyncio.sleep(0.3)  # time passing is the point: the signal is delivered, and ignored
    async with pool.lease() as lease:
        assert lease.kernel_id == first
        assert await run(lease, "print('still here')") == "still here\n"
    assert pool.stats().retirements["died"] == 0


async def test_a_preloads_settings_are_the_baseline() -> None:
    """What the preload set up (filters, logging, options) is what every reset returns to."""
    preload = (
        "import logging, warnings, numpy as np\n"
        "warnings.simplefilter('ignore', UserWarning)\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "np.set_printoptions(precision=3)\n"
    )
    probe = (
        "import logging, warnings, numpy as np\n"
        "warnings.warn('hidden by the preload')\n"
        "print(len(logging.root.handlers), logging.root.level, np.get_printoptions()['precision'])"
    )
    async with started(PoolConfig(size=1, kind=KernelKind(preload=preload))) as pool:
        before = await probe_once(pool, probe)
        assert before == "1 20 3\n"  # the preload's: one handler, INFO, precision 3
        change = (
            "import logging, warnings, numpy as np\n"
            "warnings.resetwarnings(); logging.root.handlers.clear(); np.set_printoptions(precision=8)"
        )
        assert await change_then_probe(pool, change, probe) == before
