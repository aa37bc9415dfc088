"""Cells see what they would see in the reference's cell process, over real HTTP: an empty
stdin, ``Figure.show()`` as a display, warnings that name ``<cell>``, and a manifest that is
strict JSON even when a value is NaN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import WorkerProcess, start_worker
from tests.wire import execute, read_bundle, run_ok


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.url, timeout=120) as c:
        yield c


def _strict(raw: bytes) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def test_input_meets_an_empty_stdin(client: httpx.Client) -> None:
    bundle = read_bundle(execute(client, "name = input('name? ')"))
    assert not bundle.manifest["success"]
    assert (
        bundle.manifest["traceback"].strip().splitlines()[-1] == "EOFError: EOF when reading a line"
    )
    assert bundle.stdout() == "name? "  # the prompt is written, as with a real empty stdin


def test_scripts_that_catch_eof_keep_working(client: httpx.Client) -> None:
    source = "try:\n    answer = input()\nexcept EOFError:\n    answer = 'default'"
    bundle = run_ok(client, source)
    assert bundle.variables["answer"]["preview"] == "default"


def test_getpass_meets_an_empty_stdin(client: httpx.Client) -> None:
    bundle = read_bundle(execute(client, "import getpass\nsecret = getpass.getpass('Token: ')"))
    assert not bundle.manifest["success"]
    assert bundle.manifest["traceback"].strip().splitlines()[-1] == "EOFError"
    assert "GetPassWarning" in bundle.stderr() and bundle.stderr().endswith("Token: ")
    # the next cell on that kernel is unaffected, and input() is still the EOF one
    source = "try:\n    input()\nexcept EOFError as e:\n    kind = type(e).__name__"
    assert run_ok(client, source).variables["kind"]["preview"] == "EOFError"


def test_non_finite_values_make_null_previews_and_keep_their_files(client: httpx.Client) -> None:
    source = (
        "import math\n"
        "x = math.nan\n"
        "values = [1.0, math.inf, -math.inf]\n"
        "import pandas as pd\n"
        "df = pd.DataFrame({'a': [1.0, math.nan, math.inf]})\n"
        "del math, pd"
    )
    bundle = run_ok(client, source)
    manifest = _strict(bundle.members["manifest.json"])
    variables = manifest["variables"]
    assert variables["x"]["preview"] is None
    assert variables["values"]["preview"] == [1.0, None, None]
    assert variables["df"]["preview"][1][0] in (None, "")  # NaN in a table: an empty cell
    assert variables["df"]["preview"][2][0] is None
    assert bundle.file("x") == b"NaN"  # the value itself survives in its file
    assert json.loads(bundle.file("values")) == [1.0, float("inf"), -float("inf")]


_FIGURE_SHOW = (
    "import matplotlib.pyplot as plt\n"
    "fig, ax = plt.subplots()\n"
    "ax.plot([1, 2, 3])\n"
    "fig.show()\n"
    "never_shown = plt.figure()\n"
    "del plt, ax\n"
)


def _assert_one_png_display(bundle_manifest: dict[str, Any]) -> None:
    displays = bundle_manifest["displays"]
    assert [d["content_type"] for d in displays] == ["image/png"]  # not the unshown figure
    assert displays[0]["width"] == 640 and displays[0]["height"] == 480  # figsize x dpi
    assert bundle_manifest["variables"]["_"]["content_type"] == "image/png"


def test_figure_show_is_a_display(client: httpx.Client) -> None:
    _assert_one_png_display(run_ok(client, _FIGURE_SHOW).manifest)


def test_figure_show_in_the_cell_that_first_imports_matplotlib(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A fresh kernel per cell: matplotlib is imported by the cell itself, after the agent."""
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--recycle", "fresh")
    try:
        with httpx.Client(base_url=w.url, timeout=120) as c:
            first = run_ok(c, "import sys\nloaded = 'matplotlib.figure' in sys.modules\ndel sys")
            assert first.variables["loaded"]["preview"] is False
            _assert_one_png_display(run_ok(c, _FIGURE_SHOW).manifest)
    finally:
        w.stop()


def test_plt_show_under_a_backend_the_cell_chose_is_a_display(client: httpx.Client) -> None:
    """A script's ``matplotlib.use("Agg")``: the reference shows the figure whatever the
    backend, and so do we (the inline backend would, had the cell not replaced it)."""
    source = (
        "import matplotlib\n"
        "matplotlib.use('Agg')\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3])\n"
        "plt.show()\n"
        "del plt, matplotlib\n"
    )
    bundle = run_ok(client, source)
    displays = bundle.manifest["displays"]
    assert [d["content_type"] for d in displays] == ["image/png"]
    assert displays[0]["width"] == 640 and displays[0]["height"] == 480
    follow = run_ok(client, "import matplotlib\nbackend = matplotlib.get_backend()\ndel matplotlib")
    assert "matplotlib_inline" in follow.variables["backend"]["preview"]  # reset puts it back


def test_a_warning_from_the_cell_names_the_cell(client: httpx.Client) -> None:
    """As the reference prints it: ``<cell>`` when the cell ends in an expression (the
    reference compiles such a cell as ``<cell>``), ``<string>`` otherwise (it ``exec``s it)."""
    bundle = run_ok(client, "import warnings\nwarnings.warn('careful')")
    assert bundle.stderr() == "<cell>:2: UserWarning: careful\n"
    nested = "import warnings\ndef f():\n    warnings.warn('inner')\nf()\ndel warnings, f"
    assert run_ok(client, nested).stderr() == "<string>:3: UserWarning: inner\n"
    looped = (
        "import warnings\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('always')\n"
        "    for i in range(2):\n"
        "        warnings.warn('x')"
    )
    assert run_ok(client, looped).stderr() == "<string>:5: UserWarning: x\n" * 2


def test_a_warning_from_a_library_keeps_its_file(client: httpx.Client) -> None:
    source = (
        "import json, warnings\n"
        "warnings.warn_explicit('old', UserWarning, json.__file__, 1)\n"
        "where = json.__file__\n"
        "del json, warnings"
    )
    bundle = run_ok(client, source)
    where = bundle.variables["where"]["preview"]
    assert bundle.stderr().startswith(f"{where}:1: UserWarning: old\n")


# -- errors, as the reference's cell process words them -----------------------------------------


def _plain_syntax_error(source: str) -> SyntaxError:
    """What ``exec(source)`` raises in the reference's cell process (and in this one)."""
    try:
        compile(source, "<string>", "exec", dont_inherit=True)
    except SyntaxError as error:
        return error
    raise AssertionError(f"{source!r} compiles")


@pytest.mark.parametrize(
    "source", ["x = (", "if True:\nx = 1", "print 'a'", "x = = 1", "y = 1\ndef f(:\n    pass"]
)
def test_a_syntax_error_reads_as_compile_words_it(client: httpx.Client, source: str) -> None:
    expected = _plain_syntax_error(source)
    manifest = read_bundle(execute(client, source)).manifest
    assert manifest["success"] is False
    assert manifest["error"] == str(expected)  # e.g. "'(' was never closed (<string>, line 1)"
    lines = manifest["traceback"].splitlines()
    assert lines[:2] == [
        "Traceback (most recent call last):",
        f'  File "<string>", line {expected.lineno}',
    ]
    assert lines[-1] == f"{type(expected).__name__}: {expected.msg}"


def test_a_syntax_error_after_a_magic_is_reported_where_it_is(client: httpx.Client) -> None:
    """IPython's syntax is the cell's to use: the error is the one on line 2, not the magic."""
    manifest = read_bundle(
        execute(client, "%config InlineBackend.figure_format = 'png'\nx = (")
    ).manifest
    assert manifest["error"] == str(_plain_syntax_error("pass\nx = ("))  # ... (<string>, line 2)


def _frames(traceback: str) -> list[str]:
    """The traceback's lines without the position markers (``~~^~~``), which vary by Python."""
    return [line for line in traceback.splitlines() if line.strip(" ^~")]


def test_a_traceback_is_pythons_with_the_cell_named_as_the_reference_names_it(
    client: httpx.Client,
) -> None:
    body = "def f():\n    return 1 / 0\n"
    frames = [
        "Traceback (most recent call last):",
        '  File "{0}", line 3, in <module>',
        "    {1}",
        '  File "{0}", line 2, in f',
        "    return 1 / 0",
        "ZeroDivisionError: division by zero",
    ]
    # exec'd from its text as "<string>"; a cell ending in an expression compiles as "<cell>"
    for last, name in (("x = f()", "<string>"), ("f()", "<cell>")):
        manifest = read_bundle(execute(client, body + last)).manifest
        assert manifest["error"] == "division by zero"
        assert _frames(manifest["traceback"]) == [line.format(name, last) for line in frames]


def test_a_deep_recursion_is_collapsed_and_chained_errors_are_shown(client: httpx.Client) -> None:
    source = "def r(n):\n    return r(n + 1)\nr(0)"
    traceback = read_bundle(execute(client, source)).manifest["traceback"]
    assert (
        "more times]" in traceback and len(traceback) < 4000
    )  # "[Previous line repeated N more times]"
    source = "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('no k') from e"
    lines = _frames(read_bundle(execute(client, source)).manifest["traceback"])
    assert lines[-1] == "ValueError: no k" and "KeyError: 'k'" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert not [
        line for line in lines if "interactiveshell" in line or "strata_kernel_agent" in line
    ]


def test_system_exit_is_a_failed_cell_without_ipythons_advice(client: httpx.Client) -> None:
    bundle = read_bundle(execute(client, "import sys\nprint('before')\nsys.exit(3)"))
    assert bundle.manifest["success"] is False and bundle.manifest["error"] == "3"
    assert _frames(bundle.manifest["traceback"])[-3:] == [
        '  File "<cell>", line 3, in <module>',
        "    sys.exit(3)",
        "SystemExit: 3",
    ]
    assert bundle.stdout() == "before\n" and bundle.stderr() == ""


@pytest.mark.parametrize(
    "source",
    ["rows = strata.scan('t')", "def scan():\n    return strata.scan('t')\nrows = scan()"],
)
def test_a_cell_that_reaches_for_the_strata_client_is_told_why_it_is_missing(
    client: httpx.Client, source: str
) -> None:
    """The notebook's ``strata`` client exists only in cells its server runs: the error's
    first line is Python's, the second says why, and the seed's error.json says the same."""
    bundle = read_bundle(execute(client, source))
    error = bundle.manifest["error"]
    first, second = error.split("\n")
    assert first == "name 'strata' is not defined"
    assert "strata" in second and "server" in second
    assert bundle.manifest["traceback"].endswith("NameError: name 'strata' is not defined")
    assert json.loads(bundle.members["error.json"])["message"] == error


@pytest.mark.parametrize(
    "source", ["rows = stratum.scan('t')", "raise NameError(\"name 'strata' is not defined\")"]
)
def test_other_name_errors_keep_their_one_line(client: httpx.Client, source: str) -> None:
    error = read_bundle(execute(client, source)).manifest["error"]
    assert "\n" not in error and error.startswith("name 'strata") == ("stratum" not in source)


def test_an_exception_group_is_reported_as_the_cell_error(client: httpx.Client) -> None:
    source = "raise ExceptionGroup('two', [ValueError('a'), TypeError('b')])"
    bundle = read_bundle(execute(client, source))
    assert bundle.manifest["error"] == "two (2 sub-exceptions)"
    traceback = bundle.manifest["traceback"]
    assert "ValueError: a" in traceback and "TypeError: b" in traceback
    assert 'File "<string>", line 1, in <module>' in traceback
    assert bundle.stderr() == ""


def test_lone_surrogates_in_output_arrive_as_replacement_characters(client: httpx.Client) -> None:
    """A lone surrogate (a file name that is not UTF-8, decoded with surrogateescape; a
    half of a pair) cannot be sent as UTF-8: it becomes U+FFFD, and the rest of the
    output around it is kept."""
    source = (
        "import sys\n"
        "print('before')\n"
        "print('a\\udcffb')\n"  # stands for the byte 0xff
        "print('c\\ud800d')\n"  # stands for nothing
        "sys.stderr.write('e\\udc80\\n')\n"
        "print('after')"
    )
    bundle = run_ok(client, source)
    assert bundle.stdout() == "before\na\ufffdb\nc\ufffdd\nafter\n"
    assert bundle.stderr() == "e\ufffd\n"
    failed = read_bundle(execute(client, "print('kept')\nraise ValueError('bad\\ud800')"))
    assert failed.manifest["error"] == "bad\ufffd" and failed.stdout() == "kept\n"


# -- what the reference's cell process does, where a kernel would differ -----------------------


@pytest.mark.parametrize(
    ("method", "returns"),
    [("__repr__", "raise ValueError('boom')"), ("_repr_html_", "raise ValueError('boom')"),
     ("_repr_png_", "return 'not base64'"), ("_repr_markdown_", "return 5"),
     ("_repr_latex_", "return b'bytes'")],
)  # fmt: skip
def test_a_value_whose_format_method_fails_is_still_the_cells_last_display(
    client: httpx.Client, method: str, returns: str
) -> None:
    """The reference serializes a trailing value by its type, never formatting it: a repr
    method that raises or returns the wrong thing neither fails the cell nor the request,
    nor leaves IPython's warnings in its stderr."""
    source = f"class V:\n    def {method}(self):\n        {returns}\nkept = 1\nV()"
    response = execute(client, source)
    assert response.status_code == 200, response.text
    bundle = read_bundle(response)
    assert bundle.manifest["success"] is True, bundle.manifest["error"]
    assert set(bundle.variables) == {"V", "kept", "_"}
    assert len(bundle.manifest["displays"]) == 1 and bundle.stderr() == ""


def test_markdown_only_ever_holds_its_text(client: httpx.Client, tmp_path: Any) -> None:
    """IPython's ``Markdown`` reads a file or fetches a URL when its text looks like one."""
    source = (
        "open('note.md', 'w').write('from the file')\n"
        "m = Markdown('note.md')\n"
        "seen = [m.text, str(m), repr(m), m == Markdown(text='note.md')]\n"
        "display(Markdown('http://127.0.0.1:9/never-fetched'))\n"
        "m"
    )
    bundle = run_ok(client, source)
    assert bundle.variables["seen"]["preview"] == [
        "note.md",
        "note.md",
        "Markdown(text='note.md')",
        True,
    ]
    texts = [d.get("markdown_text") for d in bundle.manifest["displays"]]
    assert texts == ["http://127.0.0.1:9/never-fetched", "note.md"]


def test_display_updates_and_clears_leave_what_a_notebook_would_show(
    client: httpx.Client,
) -> None:
    """``update_display`` replaces the display of its id and ``clear_output`` drops those
    before it (at once, or with ``wait=True`` when the next display comes), in both views:
    the manifest's displays (what Strata shows) and the Jupyter display files."""
    updates = (
        "from IPython.display import Markdown, update_display\n"
        "display(Markdown('v1'), display_id='progress')\n"
        "handle = display(Markdown('other v1'), display_id=True)\n"
        "update_display(Markdown('v2'), display_id='progress')\n"
        "handle.update(Markdown('other v2'))\n"
        "update_display(Markdown('nobody'), display_id='unknown')\n"
        "del handle"
    )
    clears = (
        "from IPython.display import Markdown, clear_output\n"
        "display(Markdown('gone'))\nclear_output()\n"
        "for step in range(3):\n"
        "    display(Markdown(f'step {step}'), clear=True)\n"
        "display(Markdown('after'))\n"
        "clear_output(wait=True)\n"  # nothing comes after: what is shown stays
    )
    for source, expected in ((updates, ["v2", "other v2"]), (clears, ["step 2", "after"])):
        bundle = run_ok(client, source)
        texts = [d.get("markdown_text") for d in bundle.manifest["displays"]]
        assert texts == expected
        files = sorted(name for name in bundle.members if name.startswith("display/"))
        assert [bundle.members[name].decode() for name in files if name.endswith(".md")] == expected


def test_asyncio_run_works_in_a_cell_and_top_level_await_still_does(client: httpx.Client) -> None:
    source = (
        "import asyncio\n"
        "async def three():\n    await asyncio.sleep(0)\n    return 3\n"
        "first = asyncio.run(three())\n"
        "loop = asyncio.new_event_loop()\nsecond = loop.run_until_complete(three())\nloop.close()\n"
        "del loop"
    )
    bundle = run_ok(client, source)
    assert [bundle.variables[n]["preview"] for n in ("first", "second")] == [3, 3]
    awaited = run_ok(client, "import asyncio\nr = await asyncio.sleep(0, result=4)")
    assert awaited.variables["r"]["preview"] == 4
    again = run_ok(client, "import asyncio\nasync def f():\n    return 5\nr = asyncio.run(f())")
    assert again.variables["r"]["preview"] == 5


def test_every_plt_show_shows_every_open_figure(client: httpx.Client) -> None:
    source = (
        "import matplotlib.pyplot as plt\n"
        "plt.figure(); plt.plot([1])\nplt.show()\nplt.show()\n"
        "plt.figure(); plt.plot([2])\nplt.show()\n"
    )
    bundle = run_ok(client, source)
    kinds = [d["content_type"] for d in bundle.manifest["displays"]]
    assert kinds == ["image/png"] * 4  # 1, 1, then 1 and 2
    # Jupyter's displays: each figure once, as the inline backend shows and closes it
    jupyter = [d for d in bundle.manifest["display"] if d["content_type"] == "image/png"]
    assert len(jupyter) == 4


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("  x = 1", "unexpected indent (<string>, line 1)"),
        (" 1 + 1", "unexpected indent (<string>, line 1)"),
        (">>> x = 1", "invalid syntax (<string>, line 1)"),
        ("if True:\n        x = 1\n    y = 2",
         "unindent does not match any outer indentation level (<string>, line 3)"),
        ("raise SyntaxError('manual')", "manual"),
        ("raise IndentationError('by hand')", "by hand"),
    ],
)  # fmt: skip
def test_a_cell_is_read_as_python_reads_it(client: httpx.Client, source: str, error: str) -> None:
    bundle = read_bundle(execute(client, source))
    assert bundle.manifest["success"] is False
    assert bundle.manifest["error"] == error
    assert "IPython" not in bundle.manifest["traceback"]


def test_what_serializing_outputs_prints_is_not_the_cells_output(client: httpx.Client) -> None:
    """The reference serializes after its capture of stdout and stderr has ended."""
    source = (
        "import pandas as pd\nimport sys\n"
        "df = pd.DataFrame({0: [1], 'a': [2]})\n"  # pandas warns about mixed column names
        "class Loud:\n"
        "    def __reduce__(self):\n"
        "        print('pickling')\n        sys.stderr.write('on stderr\\n')\n"
        "        return (int, ())\n"
        "loud = Loud()\nprint('from the cell')"
    )
    bundle = run_ok(client, source)
    assert bundle.stdout() == "from the cell\n" and bundle.stderr() == ""
    assert {"df", "loud"} <= set(bundle.variables)


@pytest.mark.parametrize(
    "source", ["open('/nonexistent/file')", "import sys\nsys.stdout.write(b'bytes')"]
)
def test_no_kernel_frame_in_a_traceback(client: httpx.Client, source: str) -> None:
    """IPython's open() wrapper and ipykernel's streams are the kernel's, not the cell's."""
    traceback = read_bundle(execute(client, source)).manifest["traceback"]
    assert "interactiveshell" not in traceback and "ipykernel" not in traceback, traceback
    assert 'File "<string>", line' in traceback or 'File "<cell>", line' in traceback


def test_names_the_reference_does_not_have(client: httpx.Client) -> None:
    """``_`` is IPython's output placeholder, unbound in the reference's cell; a
    DeprecationWarning the cell's code raises is hidden there as in any non-main module."""
    bundle = read_bundle(execute(client, "x = 1\n_"))
    assert bundle.manifest["success"] is False
    assert bundle.manifest["error"] == "name '_' is not defined"
    source = (
        "import warnings\nwarnings.warn('old', DeprecationWarning)\n"
        "warnings.warn('user', UserWarning)\nfor _ in range(2):\n    pass\n"
        "shown = 1 + 1\nshown"
    )
    bundle = run_ok(client, source)
    assert "DeprecationWarning" not in bundle.stderr() and "UserWarning: user" in bundle.stderr()
    assert bundle.variables["_"]["preview"] == 2


def test_there_is_no_store_to_pass_values_to_a_later_request(client: httpx.Client) -> None:
    bundle = read_bundle(execute(client, "x = 'kept'\n%store x"))
    assert bundle.manifest["success"] is False and "store" in bundle.manifest["error"]


def test_a_figure_output_is_pickled_still_open_in_pyplot(
    client: httpx.Client, tmp_path: Any
) -> None:
    """As from the reference's cell process (figures stay open): read back with pyplot's Agg
    canvas and known to a later ``plt.show()``. The inline backend used to close every
    figure before the outputs were serialized."""
    import subprocess
    import sys

    source = (
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure()\nplt.plot([1, 2])\n"
        "shown, ax = plt.subplots()\nax.plot([3])\nplt.show()\n"
        "still_open = plt.get_fignums()"
    )
    bundle = run_ok(client, source)
    assert bundle.variables["still_open"]["preview"] == [1, 2]
    (tmp_path / "fig.pickle").write_bytes(bundle.file("fig"))
    check = (
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "from kernel_worker.agent import codecs\n"
        f"fig = codecs.load_input({str(tmp_path / 'fig.pickle')!r}, 'pickle/object')\n"
        "fig.canvas.draw()\n"
        "print(type(fig.canvas).__name__, len(fig.canvas.buffer_rgba()) > 0, plt.get_fignums())"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "FigureCanvasAgg True [1]", out.stderr


def test_a_name_bound_to_the_object_it_already_held_is_an_output(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Any
) -> None:
    """The reference's namespace holds only the inputs: a name a cell binds is new there even
    where the preload (or IPython) gave the kernel's namespace the very same object."""
    preload = tmp_path / "preload.py"
    preload.write_text("import json as js\nCONST = 7\nmodel = {'w': [1, 2]}\nspare = 'kept'\n")
    w = start_worker(tmp_path_factory, "--pool-size", "1", "--preload", str(preload))
    try:
        with httpx.Client(base_url=w.url, timeout=120) as c:
            source = (
                "import json as js\n"
                "CONST = 7\n"
                "try:\n    from IPython.display import display\nexcept ImportError:\n    pass\n"
                "if False:\n    spare = 'kept'\n"  # a branch that did not run binds nothing
                "for CONST in [7]:\n    pass\n"
                "out = js.dumps(model)\n"
                "display(out)"
            )
            bundle = run_ok(c, source)
            assert set(bundle.variables) == {"js", "CONST", "display", "out", "_"}  # _: display
            assert bundle.variables["js"]["content_type"] == "module/import"
            assert bundle.variables["CONST"]["preview"] == 7
            assert len(bundle.manifest["displays"]) == 1  # the last expression is still shown
            # an input the cell binds to itself is no output, as in the reference
            given = {"name": "v", "format": "json/object", "file": "v.json"}
            again = run_ok(c, "v = v\nw = v", [(given, b"[1, 2]")])
            assert set(again.variables) == {"w"}
    finally:
        w.stop()


def test_the_cells_processes_are_not_told_to_print_colours(client: httpx.Client) -> None:
    """ipykernel sets these for a notebook frontend; here output is plain text, as in the
    reference's cell process (pip's errors came back wrapped in ANSI escapes)."""
    names = ("FORCE_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "TERM")
    bundle = run_ok(client, f"import os\nseen = [os.environ.get(k) for k in {names!r}]")
    assert bundle.variables["seen"]["preview"] == [None, None, None, os.environ.get("TERM")]


def test_what_rich_prints_is_stdout_text_not_a_display(client: httpx.Client) -> None:
    """rich takes a kernel for a notebook: it printed through displays, which Strata cannot
    show, and its progress bars and ``Live`` printed through a display that came back to
    their own stand-in for ``sys.stdout``, forever (the cell hung until its timeout). The
    cell's stdout is what the same code prints in a plain process, as the reference's."""
    pytest.importorskip("rich")
    source = (
        "from rich import print as rprint\nfrom rich.console import Console\n"
        "from rich.live import Live\nfrom rich.progress import Progress, track\n"
        "rprint('[bold red]alert[/bold red] done')\nConsole().print({'a': 1})\n"
        "for i in track(range(3), description='work'):\n    pass\n"
        "with Live('live-text'):\n    pass\n"
        "with Progress() as progress:\n    progress.advance(progress.add_task('bar', total=2), 2)\n"
    )
    in_a_process = subprocess.run(
        [sys.executable, "-c", source], capture_output=True, text=True, check=True, timeout=60
    )
    assert "alert done" in in_a_process.stdout and "work" in in_a_process.stdout
    bundle = run_ok(client, source, timeout_seconds=20)
    assert bundle.stdout() == in_a_process.stdout
    assert bundle.stderr() == in_a_process.stderr == ""
    assert bundle.manifest["displays"] == [] and "_" not in bundle.variables
