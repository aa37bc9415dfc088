"""The in-kernel side of one cell run: bind inputs before the cell, collect outputs after.

Shipped into every kernel as ``strata_kernel_agent.runtime`` (stdlib only at import time).
The worker sends ONE ``execute_request`` per cell: its ``metadata["strata"]`` holds the run
plan (data only: paths, names, formats, env), which the ``pre_run_cell`` hook applies; the
``post_run_cell`` hook writes the outputs and a report into the run directory before the
kernel replies, so a cell costs one round trip. Nothing of the request becomes kernel source.
"""

import ast
import contextlib
import dataclasses
import io
import json
import os
import pathlib
import re
import sys
import warnings

from . import arrow_codec, codecs, display_files, figures, rebinding, rundir, tracebacks

_SKIPPED_NAMES = frozenset(("__builtins__", "__name__", "__doc__", "__package__"))
PREVIEW_LIMIT = 64 * 1024
INLINE_IMAGE_LIMIT = 16 * 1024 * 1024
_json_dumps = json.JSONEncoder(default=repr).encode  # immune to a cell patching json.dumps


class _Run:
    """Per-request state; one exists between ``pre_run_cell`` and the pool's reset."""

    def __init__(self, plan, source=None):
        self.plan = plan
        self.source = source  # the cell's text
        self.before = {}
        self.rebound = set()  # names bound to the object they held (see rebinding)
        self.inputs = {}
        self.fingerprints = {}
        self.displays = []
        self.display_ids = {}  # display_id -> indices in displays (update_display replaces)
        self.clear_pending = False  # clear_output(wait=True): cleared by the next display
        self.recording = True
        self.error = None
        self.collected = False
        self.file_label = None  # what warnings call the cell (see _cell_file_label)


_state = {
    "run": None,
    "shell": None,
    "display": None,
    "clear_output": None,
    "figure_show": None,
    "pyplot_show": None,
    # sys.modules' names and the import finders' folders after the last run's were forgotten
    "modules": [],
    "finders": [],
}


def _current():
    return _state["run"]


def _current_plan():
    run = _state["run"]
    return None if run is None else run.plan


# -- displays ------------------------------------------------------------------------------------


def display(*objs, **kwargs):
    """IPython's ``display`` that also records the objects for the reference's display view,
    as a notebook's output area keeps them: ``update_display`` (or a handle's ``update``)
    replaces the display of that id, ``clear_output`` (or ``clear=True``) drops those before."""
    if any(_is_rich_print(obj) for obj in objs):
        objs = _printed_as_text(objs)
        if not objs:
            return None
    run = _current()
    if run is None or not run.recording or kwargs.get("raw"):
        return _state["display"](*objs, **kwargs)
    if kwargs.get("display_id") is True:  # as IPython names it, but known here
        kwargs["display_id"] = os.urandom(16).hex()
    display_id = kwargs.get("display_id")
    if kwargs.get("update"):
        for index in run.display_ids.get(str(display_id), ()):
            if objs:
                run.displays[index] = objs[0]
        return _state["display"](*objs, **kwargs)
    if kwargs.pop("clear", False):  # IPython's own would mark a clear still to come
        run.clear_pending = True
        _state["clear_output"](True)
    _apply_pending_clear(run)
    shown = [obj for obj in objs if obj is not None]
    if display_id is not None:
        first = len(run.displays)
        run.display_ids.setdefault(str(display_id), []).extend(range(first, first + len(shown)))
    run.displays.extend(shown)
    return _state["display"](*objs, **kwargs)


def clear_output(wait=False):
    """IPython's ``clear_output``: the displays shown so far leave the display view too (at
    once, or with ``wait=True`` when the next display comes)."""
    run = _current()
    if run is not None and run.recording:
        run.clear_pending = True
        if not wait:
            _apply_pending_clear(run)
    return _state["clear_output"](wait)


def _apply_pending_clear(run):
    if run.clear_pending:
        run.clear_pending = False
        run.displays.clear()
        run.display_ids.clear()


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def _is_rich_print(obj):
    kind = type(obj)
    return kind.__name__ == "JupyterRenderable" and kind.__module__ == "rich.jupyter"


def _rich_as_in_a_process(module):
    """rich takes a kernel for a notebook: it sent what it printed (``rich.print``, a
    ``Console``, a ``RichHandler``) as displays, which Strata cannot show, and a progress bar
    or ``Live`` wanted ipywidgets. Here it writes to stdout as in the reference's cell
    process, a plain file: 80 columns, no colours, a progress bar's last state."""
    if callable(getattr(module, "_is_jupyter", None)):
        module._is_jupyter = _not_a_notebook


def _not_a_notebook():
    return False


def _printed_as_text(objs):
    """What a ``Console(force_jupyter=True)`` sends as a display goes to stdout as text, as in
    the reference's cell process (see :func:`_rich_as_in_a_process`)."""
    kept = []
    for obj in objs:
        text = getattr(obj, "text", None) if _is_rich_print(obj) else None
        if isinstance(text, str):  # styled for a notebook: plain, as rich writes to a pipe
            _unproxied(sys.stdout).write(_ANSI_ESCAPE.sub("", text))
        else:
            kept.append(obj)
    return kept


def _unproxied(stream):
    """The stream under rich's stand-ins for ``sys.stdout``: a progress bar or ``Live``
    replaces it with a proxy that prints through its console, which here sends a display,
    which came back to the proxy, forever (the cell hung until its timeout)."""
    for _ in range(8):
        inner = getattr(type(stream), "rich_proxied_file", None)
        if inner is None:
            break
        stream = stream.rich_proxied_file
    return stream


@dataclasses.dataclass(frozen=True)
class Markdown:
    """The cell's ``Markdown``: text shown as Markdown, as the reference's cell process has it.

    IPython's class of that name reads a file or fetches a URL when the text looks like a
    path or an address; this one only ever holds the text it is given.
    """

    text: str

    def _repr_markdown_(self):
        return self.text

    def __str__(self):
        return self.text


def _patch_display():
    import IPython.core.display_functions as functions
    import IPython.display as public

    _state["display"] = functions.display
    _state["clear_output"] = functions.clear_output
    functions.display = display
    public.display = display
    functions.clear_output = public.clear_output = clear_output
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None:
        inline.display = display


def _show_figure(figure, warn=True):
    """``Figure.show()`` during a cell: the figure is displayed (recorded, as in the
    reference, and sent as IPython's display); a headless backend would show nothing."""
    run = _current()
    if run is not None and run.recording:
        display(figure)
        return None
    return _state["figure_show"](figure, warn=warn)


def _quiet_formatting(shell):
    """Formatting a display never fails the cell, and a format method that returns the wrong
    type leaves no warning in its stderr: that display just lacks the format (see
    ``tracebacks.quiet``)."""
    from IPython.core.formatters import FormatterWarning

    formatter = shell.display_formatter
    format_ = formatter.format

    def format(obj, include=None, exclude=None):
        with tracebacks.quiet(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FormatterWarning)
            return format_(obj, include=include, exclude=exclude)

    formatter.format = format


def _no_loop_while_synchronous(shell):
    """Synchronous cell code runs with no event loop running, as in a plain process.

    The kernel runs its cells from inside its own event loop, so ``asyncio.run()`` and
    ``loop.run_until_complete()`` in a cell (or in a library it calls) would fail with
    "cannot be called from a running event loop", where the reference's cell process runs
    them. The loop is blocked while a synchronous statement runs anyway; it is marked
    running again (and made the thread's loop again: ``asyncio.run`` leaves none) before
    anything else happens. Statements IPython runs awaited (top-level ``await``) keep it.
    """
    import asyncio
    from asyncio import events

    run_code = shell.run_code

    async def run_code_without_loop(code_obj, result=None, *, async_=False):
        loop = None if async_ else events._get_running_loop()
        if loop is None:
            return await run_code(code_obj, result, async_=async_)
        events._set_running_loop(None)
        try:
            return await run_code(code_obj, result, async_=async_)
        finally:
            events._set_running_loop(loop)
            asyncio.set_event_loop(loop)

    shell.run_code = run_code_without_loop


def _plain_python_text(shell):
    """A cell's text is read as Python reads it: IPython would dedent an indented cell and
    strip ``>>>`` and ``In [1]:`` prompts, which the reference's cell process refuses as
    Python does (``unexpected indent``, ``invalid syntax``). IPython's own syntax (``%magic``,
    ``!shell``) is kept."""
    from IPython.core import inputtransformer2 as transformers

    cleanup = shell.input_transformer_manager.cleanup_transforms
    for dropped in (
        transformers.leading_indent,
        transformers.classic_prompt,
        transformers.ipython_prompt,
    ):
        if dropped in cleanup:
            cleanup.remove(dropped)


def _patch_figure(module):
    figure = getattr(module, "Figure", None)
    show = getattr(figure, "show", None)
    if show is None or show is _show_figure:
        return
    _state["figure_show"] = show
    figure.show = _show_figure


def _show_pyplot(*args, **kwargs):
    """``plt.show()`` during a cell: every open figure is displayed, whatever the backend,
    and stays open, as in the reference (a second ``plt.show()`` shows them again). The
    inline backend's own ``show`` would close them, so it is not called; its end-of-cell
    flush then has nothing new to show unless the cell draws again."""
    run = _current()
    pyplot = sys.modules.get("matplotlib.pyplot")
    if run is not None and run.recording and pyplot is not None:
        for number in pyplot.get_fignums():
            display(pyplot.figure(number))
        inline_show = getattr(sys.modules.get("matplotlib_inline.backend_inline"), "show", None)
        if inline_show is not None and _inline_backend():
            inline_show._draw_called = False  # shown: the end-of-cell flush leaves them
            inline_show._to_draw = []
        return None
    return _state["pyplot_show"](*args, **kwargs)


def _inline_backend():
    """Whether the inline backend is matplotlib's (read raw: reading ``rcParams["backend"]``
    would make matplotlib choose one now)."""
    params = getattr(sys.modules.get("matplotlib"), "rcParams", {})
    backend = dict.get(params, "backend", "") if isinstance(params, dict) else ""
    return "matplotlib_inline" in str(backend)


def _patch_pyplot(module):
    show = getattr(module, "show", None)
    if show is None or show is _show_pyplot:
        return
    _state["pyplot_show"] = show
    module.show = _show_pyplot


def _patch_figure_show():
    """``Figure.show`` and ``pyplot.show`` patched now, or the moment a cell imports their
    modules (the pool's in-kernel helper watches imports)."""
    helper = sys.modules["_kernel_pool_agent"]
    helper.after_import("matplotlib.figure", _patch_figure)
    helper.after_import("matplotlib.pyplot", _patch_pyplot)
    helper.after_import("matplotlib_inline.backend_inline", _keep_figures_open)
    helper.after_import("rich.console", _rich_as_in_a_process)


def _stop_recording():
    """``post_execute`` runs before the inline backend flushes figures nobody showed."""
    run = _current()
    if run is not None:
        run.recording = False


def _keep_figures_open(module):
    """The inline backend shows the figures nobody showed at the end of a cell and would
    then close them all, before the cell's outputs are serialized: a figure that is an output
    would be pickled detached from pyplot (read back without its Agg canvas, and unknown to
    a later ``plt.show()``), where the reference's cell process leaves figures open. Here
    they stay open until the reset closes them."""
    config = sys.modules.get("matplotlib_inline.config")
    backend = getattr(config, "InlineBackend", None)
    if backend is not None:
        backend.instance().close_figures = False


# -- the run ---------------------------------------------------------------------------------------


def _parent_plan(shell):
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent("shell") or {}
    metadata = parent.get("metadata") or {}
    return metadata.get("strata")


def _pre_run_cell(info=None):
    shell = _state["shell"]
    plan = _parent_plan(shell)
    if plan is None:
        return
    run = _Run(plan, getattr(info, "raw_cell", None))
    _state["run"] = run
    try:
        _prepare(shell, run)
    except BaseException as exc:  # reported as the cell's own failure, never swallowed
        run.error = exc
    run.before = {name: id(value) for name, value in shell.user_ns.items()}
    # a name the cell binds to the object it held is an output all the same, except an
    # input's (the reference's rule: its namespace holds only what the request gave)
    given = _given_names(plan)
    run.rebound = rebinding.start(
        name for name in run.before if name not in given and not name.startswith("_")
    )


def _given_names(plan):
    names = {spec["name"] for spec in plan.get("inputs", ())}
    names.update(plan.get("paths") or ())
    for table in plan.get("tables") or ():
        names.update((table, f"{table}_snapshot"))
    return names


def _prepare(shell, run):
    plan = run.plan
    arrow_codec.offer_spares(plan.get("spares"))
    for key, value in (plan.get("env") or {}).items():
        os.environ[str(key)] = str(value)
    work_dir = plan.get("work_dir")
    if work_dir:
        os.chdir(work_dir)
    ns = shell.user_ns
    for name in ("_", "__", "___"):  # IPython's output placeholders: no such names here
        if ns.get(name, None) == "":
            del ns[name]
    for spec in plan.get("inputs", ()):
        name = spec["name"]
        try:
            injected = {
                sub["name"]: codecs.load_input(sub["path"], sub["content_type"])
                for sub in spec.get("injected", ())
            }
            value = codecs.load_input(
                spec["path"],
                spec["content_type"],
                injected=injected or None,
                work_dir=work_dir,
                limits=plan.get("limits"),
            )
        except codecs.RArtifactError as exc:  # the two errors that name their input
            raise codecs.RArtifactError(exc.file_path, variable_name=name) from None
        except codecs.PrecisionError as exc:
            raise codecs.PrecisionError(
                exc.stored_dtype, exc.reconstructed_dtype, variable_name=name
            ) from None
        except Exception as exc:
            raise InputError(f"Error deserializing {name}: {exc}") from exc
        ns[name] = value
        run.inputs[name] = value
        run.fingerprints[name] = codecs.fingerprint(value)
    for name, path in (plan.get("paths") or {}).items():
        ns[name] = pathlib.Path(path)
    for name, table in (plan.get("tables") or {}).items():
        ns[name] = table.get("uri", "")
        ns[f"{name}_snapshot"] = table.get("snapshot_id")


class InputError(Exception):
    """An input could not be loaded; the cell does not run."""


InputError.__module__ = "builtins"  # a traceback names it InputError, not this agent's module


def raise_pending():
    """Called in place of the cell when preparing it failed."""
    run = _current()
    if run is not None and run.error is not None:
        error, run.error = run.error, None
        raise error


class _FailCell(ast.NodeTransformer):
    """Replace the cell by :func:`raise_pending` when its inputs could not be prepared."""

    def visit_Module(self, node):
        run = _current()
        if run is None or run.error is None:
            return node
        call = ast.parse("__import__('strata_kernel_agent').runtime.raise_pending()")
        return ast.fix_missing_locations(call)


# -- collection ----------------------------------------------------------------------------------


def _is_output(name, value_id, run):
    if name.startswith("_") or name in _SKIPPED_NAMES:
        return False
    if name in run.plan.get("mutation_defines", ()):
        return True
    return run.before.get(name) != value_id or name in run.rebound


def _serialize(name, value, files_dir, for_display=False):
    try:
        meta = codecs.serialize(name, value, files_dir, for_display=for_display)
    except Exception as exc:  # a codec bug must not lose the other outputs
        return {"error": f"{type(exc).__name__}: {exc}", "type": type(value).__name__}
    _bound_preview(meta)
    return meta


def _bound_preview(meta):
    """Keep the manifest small: a preview is for display, the value itself is in its file."""
    url = meta.get("inline_data_url")
    if isinstance(url, str) and len(url) > INLINE_IMAGE_LIMIT:
        del meta["inline_data_url"]  # the image is still whole in its file
        meta["inline_data_url_omitted"] = True
    preview = meta.get("preview")
    if preview is None or isinstance(preview, (bool, int, float)):
        return
    text = preview if isinstance(preview, str) else None
    if text is None:
        try:
            size = len(_json_dumps(preview))
        except (TypeError, ValueError):
            return
        if size <= PREVIEW_LIMIT:
            return
        meta["preview"] = _trimmed(preview, PREVIEW_LIMIT)  # the same shape, fewer items
        meta["preview_truncated"] = True
        return
    if len(text) > PREVIEW_LIMIT:
        meta["preview"] = text[:PREVIEW_LIMIT] + "…"
        meta["preview_truncated"] = True
    elif text is not preview:
        meta["preview"] = text
        meta["preview_truncated"] = True


def _trimmed(value, budget):
    """``value`` (JSON data) cut to about ``budget`` characters of JSON, keeping its shape:
    a list keeps its leading items that fit whole (a table preview, its first rows), a
    dict its leading entries, a string its start; an item that alone does not fit is cut
    the same way and ends the container."""
    if isinstance(value, str):
        return value if len(value) <= budget else value[: max(budget, 0)] + "…"
    if isinstance(value, list):
        kept, used = [], 2
        for item in value:
            size = len(_json_dumps(item)) + 2
            if used + size > budget:
                if not kept:
                    kept.append(_trimmed(item, budget - used))
                break
            kept.append(item)
            used += size
        return kept
    if isinstance(value, dict):
        entries, used = {}, 2
        for key, item in value.items():
            size = len(_json_dumps(key)) + len(_json_dumps(item)) + 4
            if used + size > budget:
                entries[key] = _trimmed(item, budget - used - len(_json_dumps(key)) - 4)
                break
            entries[key] = item
            used += size
        return entries
    return value


def _collect_variables(ns, run, files_dir):
    variables = {}
    values = {}
    for name, value in list(ns.items()):
        if _is_output(name, id(value), run):
            variables[name] = _serialize(name, value, files_dir)
            values[name] = value
    return variables, values


def _collect_displays(shell, run, variables, values, files_dir):
    result = getattr(shell.last_execution_result, "result", None)
    shown = list(run.displays)
    if result is not None:
        shown.append(result)
    displays = []
    for index, obj in enumerate(shown):
        displays.append(_display_entry(index, obj, variables, values, files_dir))
    return displays


def _display_entry(index, obj, variables, values, files_dir):
    """A display that is a variable of the same content type reuses that variable's file."""
    for name, value in values.items():
        if value is obj and "error" not in variables[name]:
            kind = codecs.detect_content_type(obj, for_display=True)
            if variables[name].get("content_type") == kind:
                return dict(variables[name])
    return _serialize(f"__display__{index}", obj, files_dir, for_display=True)


def _post_run_cell(result=None):
    """After a successful cell (and before the kernel replies), collect its outputs."""
    run = _current()
    if run is None or run.collected or (result is not None and not result.success):
        return
    run.collected = True
    try:
        with _silenced():
            collect(run)
    except BaseException as exc:  # reported to the worker, never lost in the kernel's log
        _write_report(run.plan["report_path"], {"error": f"{type(exc).__name__}: {exc}"})
    finally:
        arrow_codec.offer_spares(None)  # offered to this run's outputs only


@contextlib.contextmanager
def _silenced():
    """What serializing outputs prints or warns (pandas on mixed-type column names, a
    ``__reduce__`` that prints) is not the cell's output: the reference's cell process
    serializes after its capture of stdout and stderr has ended."""
    sink = io.StringIO()
    with (
        contextlib.redirect_stdout(sink),
        contextlib.redirect_stderr(sink),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        yield


def collect(run):
    """Serialize the cell's outputs and displays; write the report next to them."""
    shell = _state["shell"]
    files_dir = run.plan["files_dir"]
    if not rundir.real_folder(files_dir):  # the worker says what the cell did to it
        raise RuntimeError("the outputs' folder is no longer the worker's")
    left = rundir.set_aside_contents(files_dir)  # nothing is written through the cell's links
    folder = os.path.basename(files_dir)
    displaced = {f"{folder}/{name}": mode for name, mode in left.items()}
    ns = shell.user_ns
    variables, values = _collect_variables(ns, run, files_dir)
    displays = _collect_displays(shell, run, variables, values, files_dir)
    displays = display_files.checked(displays, files_dir, run.plan)  # the caps, files shared
    if displays:
        variables["_"] = displays[-1]
    warnings = codecs.mutation_warnings(run.fingerprints, ns, set(run.inputs), values)
    report = {
        "variables": variables,
        "displays": displays,
        "mutation_warnings": warnings,
        "build_env": codecs.build_env(),
    }
    _write_report(run.plan["report_path"], report, displaced)


def _write_report(path, report, displaced=None):
    """The report as a new file; ``displaced`` (``{where: st_mode}``) tells the worker what
    the cell left where the agent writes, set aside (what held the report's name too)."""
    fd, mode = rundir.create_new(path)
    displaced = dict(displaced or {})
    if mode is not None:
        displaced[os.path.basename(path)] = mode
    if displaced:
        report["displaced"] = displaced
    with open(fd, "w", encoding="utf-8") as fh:
        fh.write(_json_dumps(report))


def _end_run():
    run = _state["run"]
    _state["run"] = None
    rebinding.stop()
    arrow_codec.offer_spares(None)
    figures.forget_renders()
    if run is not None:
        _forget_run_imports(run)


def _forget_run_imports(run):
    """Forget modules imported from the run directory, and import caches of its folders.

    A module the cell wrote and imported (``helpers.py`` in its working directory) or found
    in a folder input would otherwise answer the next request's ``import`` with this
    request's code, from a deleted folder; a fresh interpreter imports that request's own
    file. The caches would also keep one finder per request whose cell imported anything.
    """
    work_dir = run.plan.get("work_dir")
    if not work_dir:
        return
    root = os.path.join(os.path.dirname(work_dir), "")
    # only names added since the last run are looked at (in the background, not before a cell)
    names, before = list(sys.modules), _state["modules"]
    if names != before:
        if names[: len(before)] == before:  # the usual change: names added at the end
            names = names[len(before) :]
        modules = sys.modules
        for name in [n for n in names if _imported_from(modules.get(n), root)]:
            del modules[name]
        _state["modules"] = list(modules)
    # after the modules: reading a namespace package's __path__ may look in the run dir again
    cache = sys.path_importer_cache
    keys = list(cache)
    if keys != _state["finders"]:
        for key in [k for k in keys if isinstance(k, str) and k.startswith(root)]:
            del cache[key]
        _state["finders"] = list(cache)


def _imported_from(module, root):
    """Whether ``module``'s file (or a namespace package's folder) is below ``root``."""
    try:
        attributes = vars(module)  # never a lazy module's __getattr__
        location = attributes.get("__file__")
        if isinstance(location, str):
            return location.startswith(root)
        return any(str(folder).startswith(root) for folder in attributes.get("__path__") or ())
    except Exception:  # not a module: nothing of the run's
        return False


class _Exit:
    """``exit()``/``quit()`` end the cell with SystemExit instead of the whole kernel."""

    def __repr__(self):
        return "Call exit() to stop the cell"

    def __call__(self, code=None):
        raise SystemExit() if code is None else SystemExit(code)


# -- warnings ------------------------------------------------------------------------------------


def _cell_warning_format(shell):
    """A warning raised by the cell's own code names the cell as the reference's cell
    process does (see :func:`_cell_file_label`), instead of the kernel's cache file for the
    cell (a temporary path) followed by the source line; warnings from any other file keep
    the usual format."""
    import warnings

    original = warnings.formatwarning

    def formatwarning(message, category, filename, lineno, line=None):
        if tracebacks.is_cell_file(shell, filename):
            filename, line = _cell_file_label(), ""
        return original(message, category, filename, lineno, line)

    warnings.formatwarning = formatwarning
    # Python and IPython show a DeprecationWarning raised by ``__main__``'s code, which is
    # the cell's here; the reference's cell has no ``__name__``, so Python hides them there
    warnings.filters[:] = [f for f in warnings.filters if not _shows_main_deprecations(f)]
    getattr(warnings, "_filters_mutated", lambda: None)()  # drop cached decisions


def _shows_main_deprecations(entry):
    action, _message, category, module, _lineno = entry
    pattern = getattr(module, "pattern", module)
    return (
        action == "default"
        and isinstance(category, type)
        and issubclass(category, DeprecationWarning)
        and isinstance(pattern, str)
        and pattern.startswith("__main__")
    )


def _current_source():
    run = _current()
    return None if run is None else run.source


def _cell_file_label():
    """``<cell>`` when the cell ends in an expression, else ``<string>``: the reference
    compiles a cell that ends in an expression as ``<cell>`` (to evaluate that expression)
    and ``exec``s any other cell from its source text."""
    run = _current()
    if run is None or run.source is None:
        return "<cell>"
    if run.file_label is None:
        try:
            body = ast.parse(run.source).body
        except SyntaxError:  # IPython syntax (magics): the reference's exec path
            body = []
        run.file_label = "<cell>" if body and isinstance(body[-1], ast.Expr) else "<string>"
    return run.file_label


# -- stdin ---------------------------------------------------------------------------------------


def _input_at_eof(prompt=""):
    """``input()`` as in a process whose stdin is empty (the reference's cell process): the
    prompt is written, then ``EOFError``; ipykernel would raise StdinNotImplementedError,
    which code written for scripts (``except EOFError``) does not expect."""
    sys.stdout.write(str(prompt))
    raise EOFError("EOF when reading a line")


def _getpass_at_eof(prompt="Password: ", stream=None):
    """``getpass.getpass()`` without a terminal and with an empty stdin: warns, writes the
    prompt to ``stream`` (stderr by default), then ``EOFError``."""
    import getpass
    import warnings

    warnings.warn("Can not control echo on the terminal.", getpass.GetPassWarning, stacklevel=2)
    stream = stream if stream is not None else sys.stderr
    stream.write("Warning: Password input may be echoed.\n" + str(prompt))
    raise EOFError


def _stdin_at_eof(shell):
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:  # ipykernel installs these as input/getpass around each cell
        kernel.raw_input = _input_at_eof
        kernel.getpass = _getpass_at_eof


def install(shell):
    """Hook the agent into ``shell``; called once per kernel before its baseline is taken."""
    _state["shell"] = shell
    _patch_display()
    _quiet_formatting(shell)
    _no_loop_while_synchronous(shell)
    _plain_python_text(shell)
    # %store keeps values on disk for any later request (the reference has no such store)
    shell.magics_manager.magics["line"].pop("store", None)
    _patch_figure_show()
    figures.install(shell)
    display_files.install(shell, _current_plan)
    shell.events.register("pre_run_cell", _pre_run_cell)
    shell.events.register("post_execute", _stop_recording)
    shell.events.register("post_run_cell", _post_run_cell)
    shell.ast_transformers.append(_FailCell())
    shell.ast_transformers.append(rebinding.MarkRebinds())
    shell.InteractiveTB.set_mode(mode="Plain")  # the fastest of IPython's layouts
    tracebacks.install(shell, _current_source, _cell_file_label)
    shell.colors = "nocolor"
    shell.user_ns["display"] = display
    shell.user_ns["exit"] = shell.user_ns["quit"] = _Exit()
    _stdin_at_eof(shell)
    _cell_warning_format(shell)
    shell.user_ns["Markdown"] = Markdown
    pool_helper = sys.modules.get("_kernel_pool_agent")
    if pool_helper is not None:
        pool_helper.register_reset_hook(_end_run)
    return True
