"""Kernels on another Python minor than the worker's, in an environment of their own.

The pool's in-kernel code is shipped as source and must run unchanged on every Python the
kernels may use (3.11 to 3.13) beside whatever library versions the kernel's environment
has. For each minor other than the worker's, a session fixture makes a virtual environment
(uv, from pyenv's interpreter; cached between runs) with its own ipykernel, IPython,
pyarrow and cloudpickle (the 3.12 one pinned to older majors than the worker's), writes a
kernelspec for it, and a representative set of the reset and carry-over tests runs against
a pool of that kernel. A minor that is not installed is skipped, saying so.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernel_pool import KernelKind, Pool, PoolConfig
from tests.markers import quick_subset
from tests.pool.test_pool import assert_reset_path, last, run, settle, started
from tests.pool.test_reset_state import (
    CASES,
    KERNEL_CASES,
    change_then_probe,
    check_monitoring_tool,
    probe_once,
)
from tests.setups import kernel_setup

__all__ = ["last"]  # the fixture, imported for the tests below

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".venv" / "bin" / "uv"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "strata-kernel-tests"
# libraries of the kernel's own environment: not the worker's versions
REQUIREMENTS = {
    "3.12": ("ipykernel>=6.29,<7", "ipython>=8.20,<9", "pyarrow>=15,<20", "cloudpickle>=3.0"),
    "3.13": ("ipykernel>=6.29", "pyarrow>=18", "cloudpickle>=3.0"),
}
MINORS = [m for m in REQUIREMENTS if m != f"{sys.version_info[0]}.{sys.version_info[1]}"]
# cases that need only the standard library and the kernel itself
_THIRD_PARTY = re.compile(r"\b(numpy|pandas|matplotlib|pyplot|polars|scipy|torch|seaborn)\b")
STDLIB_CASES = [
    name
    for name, case in {**CASES, **KERNEL_CASES}.items()
    if not _THIRD_PARTY.search(case.change + case.probe)
]


def _interpreter(minor: str) -> Path | None:
    """pyenv's interpreter of ``minor`` (the newest patch release), or None."""
    pattern = os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python{minor}")
    found = sorted(glob.glob(pattern), key=lambda p: [int(n) for n in re.findall(r"\d+", p)])
    return Path(found[-1]) if found else None


def _environment(minor: str, python: Path) -> Path:
    """A virtual environment of ``python`` with the minor's requirements, made once."""
    wanted = json.dumps([str(python), *REQUIREMENTS[minor]])
    folder = CACHE / f"py{minor}-{hashlib.sha256(wanted.encode()).hexdigest()[:12]}"
    if (folder / "ready").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    made = folder.with_name(folder.name + ".making")
    shutil.rmtree(made, ignore_errors=True)
    subprocess.run([UV, "venv", "-q", "--python", python, made], check=True, timeout=300)
    install = [UV, "pip", "install", "-q", "--python", made / "bin" / "python"]
    subprocess.run([*install, *REQUIREMENTS[minor]], check=True, timeout=600)
    # a virtual environment is tied to its path: make it where it stays, then mark it done
    subprocess.run([UV, "venv", "-q", "--python", python, folder], check=True, timeout=300)
    shutil.rmtree(made)
    subprocess.run(
        [*install[:-1], folder / "bin" / "python", *REQUIREMENTS[minor]], check=True, timeout=600
    )
    (folder / "ready").write_text(wanted)
    return folder


@dataclass(frozen=True)
class OtherPython:
    """A kernelspec whose kernels run another Python minor, in an environment of its own."""

    minor: str
    kernel_name: str
    jupyter_path: Path
    """The folder to put on ``JUPYTER_PATH`` for jupyter_client to find the kernelspec."""


# the quick loop proves the in-kernel code on one other minor, with a few cases
QUICK_MINOR = "3.12" if "3.12" in MINORS else MINORS[0]
QUICK_CASES = ("warnings filter", "signal handler")


@pytest.fixture(
    scope="session", params=quick_subset(MINORS, [QUICK_MINOR]), ids=[f"python{m}" for m in MINORS]
)
def other_python(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> OtherPython:
    minor: str = request.param
    python = _interpreter(minor)
    if python is None:
        pytest.skip(f"Python {minor} is not installed (looked for pyenv's {minor}.*)")
    if not UV.exists():
        pytest.skip("uv is not installed in the project's virtual environment")
    environment = _environment(minor, python)
    name = f"python{minor}-env"
    jupyter_path = tmp_path_factory.mktemp("jupyter")
    spec = jupyter_path / "kernels" / name
    spec.mkdir(parents=True)
    argv = [str(environment / "bin" / "python"), "-m", "ipykernel_launcher"]
    spec.joinpath("kernel.json").write_text(
        json.dumps(
            {"argv": [*argv, "-f", "{connection_file}"], "display_name": name, "language": "python"}
        )
    )
    return OtherPython(minor, name, jupyter_path)


@pytest.fixture
async def pool(other_python: OtherPython, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pool]:
    monkeypatch.setenv("JUPYTER_PATH", str(other_python.jupyter_path))
    preload = "import json\nmodel = {'weights': [1, 2, 3]}"
    kind = KernelKind(kernel_name=other_python.kernel_name, preload=preload)
    async with started(PoolConfig(size=1, kind=kind)) as p:
        yield p


async def test_the_kernel_runs_the_other_python_and_its_own_libraries(
    pool: Pool, other_python: OtherPython
) -> None:
    async with pool.lease() as lease:
        out = await run(
            lease,
            "import sys, ipykernel, pyarrow\n"
            "print(f'{sys.version_info[0]}.{sys.version_info[1]}', sys.prefix)\n"
            "print(model['weights'][1] + 40)",
        )
    version, prefix = out.splitlines()[0].split()
    assert version == other_python.minor
    assert prefix != sys.prefix and "strata-kernel-tests" in prefix
    assert out.splitlines()[1] == "42"


@pytest.mark.parametrize("name", quick_subset(STDLIB_CASES, QUICK_CASES))
async def test_reset_puts_back_what_a_cell_changed(pool: Pool, name: str) -> None:
    case = CASES.get(name) or KERNEL_CASES[name]
    before = await probe_once(pool, case.probe)
    after = await change_then_probe(pool, case.change, case.probe)
    assert after == before


async def test_a_monitoring_tool_a_cell_took_is_given_back(pool: Pool) -> None:
    await check_monitoring_tool(pool)  # every minor here has sys.monitoring


async def test_reset_isolates_consecutive_leases(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(
            lease,
            "import os, sys, tempfile\nleaked = 1\nos.environ['LEAK_VAR'] = 'x'\n"
            "os.chdir(tempfile.gettempdir())\nsys.path.append('/leak')\n1 + 1\n",
            last=last,
        )
    await settle(pool, idle=1)
    assert_reset_path(pool, last)
    async with pool.lease() as lease:
        assert lease.kernel_id == first, "the kernel was replaced, not reset"
        out = await run(
            lease,
            "import os, sys\n"
            "print('leaked' in dir(), 'LEAK_VAR' in os.environ, '/leak' in sys.path, model)",
        )
    assert out == "False False False {'weights': [1, 2, 3]}\n"


@pytest.mark.slow
async def test_a_replaced_preloaded_name_retires_the_kernel(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(lease, "model = None", last=last)
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id != first
        assert await run(lease, "print(model)") == "{'weights': [1, 2, 3]}\n"


@pytest.mark.slow
async def test_sys_modules_entries_a_cell_made_are_removed(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(
            lease,
            "import sys, types\nfrom unittest import mock\n"
            "sys.modules['made_here'] = types.ModuleType('made_here')\n"
            "sys.modules['heavy_library'] = mock.MagicMock()\n",
            last=last,
        )
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id == first
        out = await run(
            lease, "import sys\nprint('made_here' in sys.modules, 'heavy_library' in sys.modules)"
        )
    assert out == "False False\n"


@pytest.mark.slow
async def test_a_thread_left_running_retires_the_kernel(pool: Pool, last: bool) -> None:
    async with pool.lease() as lease:
        first = lease.kernel_id
        await run(
            lease,
            "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()",
            last=last,
        )
    await settle(pool, idle=1)
    async with pool.lease() as lease:
        assert lease.kernel_id != first


async def test_installed_setup_code_gets_the_pools_hooks(
    other_python: OtherPython, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shipped package whose modules import one another, installed with the pool's hooks:
    its reset hook runs in every reset, its import hook when a cell imports the module."""
    monkeypatch.setenv("JUPYTER_PATH", str(other_python.jupyter_path))
    setup = kernel_setup(
        "from .state import imported, resets\n"
        "def install(shell, hooks):\n"
        "    hooks.register_reset_hook(lambda: resets.append(1))\n"
        "    hooks.after_import('colorsys', lambda module: imported.append(module.__name__))\n",
        modules={"state.py": "resets = []\nimported = []\n"},
    )
    name = setup.packages[0].name
    config = PoolConfig(size=1, setup=setup, kind=KernelKind(kernel_name=other_python.kernel_name))
    async with started(config) as pool:
        for _ in range(2):
            async with pool.lease() as lease:
                await run(lease, "import colorsys")
            await settle(pool, idle=1)
        async with pool.lease() as lease:
            state = f"__import__('sys').modules['{name}.state']"
            out = await run(lease, f"print(len({state}.resets), {state}.imported)")
    assert out == "2 ['colorsys']\n"
