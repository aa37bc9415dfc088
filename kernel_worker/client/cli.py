"""``strata-kernel-worker run``: send one cell file to a running worker, for humans.

::

    strata-kernel-worker run cell.py --input df=data.parquet --url http://127.0.0.1:9000 --out out/

The cell's stdout and stderr are printed (while it runs: the worker is asked for its
console every second, and stderr shows how long it has been queued or running, or what it
waits on, such as ``building environment``); then the value of its last
expression, as Jupyter shows it, on stdout, and a line per output (name, format, preview)
on stderr. A cell that raised prints its traceback. A worker that answers ``503`` with
``Retry-After`` (all its executions taken, shutting down) is waited out and sent the cell
again, saying so.

With ``--out DIR`` the bundle the worker sent is saved as it came, so that every path its
``DIR/manifest.json`` names is there: ``files/<output>`` (each output as the worker encoded
it: ``.arrow`` is an Arrow IPC stream, ``.json``, ``.pickle``), the displays' formats
(``display/<n><ext>``; images as ``files/__display__<n>.png``), ``stdout.txt``,
``stderr.txt``, ``console.json``.

Inputs are read by their file's extension: ``.parquet``, ``.csv``, ``.arrow``/``.feather``
become a pandas DataFrame (a pyarrow Table without pandas), ``.json`` the JSON value,
``.npy`` a numpy array, ``.pickle``/``.pkl`` the pickled object (sent as it is, unpickled
only in the kernel); any other file arrives as a ``pathlib.Path`` to a copy of it.

Exit status: 0 the cell ran, 1 the cell raised, 2 usage, 3 the worker could not run it
(unreachable, refused, timed out).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TextIO

from .session import (
    CellResult,
    CellTimeout,
    Client,
    ClientError,
    EncodedInput,
    Progress,
    RequestFailed,
)

__all__ = ["main"]

URL_ENV = "STRATA_KERNEL_WORKER_URL"
TOKEN_ENV = "STRATA_WORKER_TOKEN"
EXIT_CELL_ERROR = 1
EXIT_WORKER_FAILED = 3

_PREVIEW_CHARS = 60
_STATUS_EVERY_SECONDS = 10.0  # on a stderr that is not a terminal


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata-kernel-worker run",
        description="Run one cell on a running kernel worker and print (or save) its results.",
    )
    parser.add_argument("cell", help="the cell's Python source file ('-' for stdin)")
    parser.add_argument(
        "--input",
        "-i",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="bind the file at PATH as variable NAME (repeatable)",
    )
    parser.add_argument(
        "--env",
        "-e",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for the cell (repeatable)",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, "http://127.0.0.1:9000"),
        help=f"the worker's URL, or its /v1/execute URL [env {URL_ENV}; default %(default)s]",
    )
    parser.add_argument("--out", "-o", type=Path, help="save outputs and displays into this dir")
    parser.add_argument(
        "--timeout", type=_timeout, default=30.0, help="cell timeout in seconds (default 30)"
    )
    parser.epilog = f"The bearer token, if the worker wants one, is read from ${TOKEN_ENV}."
    return parser


def _timeout(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.out is not None:  # before the cell runs: its results must have somewhere to go
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            parser.error(f"--out {args.out}: {exc.strerror or exc}")
    source = _read_source(parser, args.cell)
    inputs = {name: _load(parser, name, raw) for name, raw in _pairs(parser, args.input, "--input")}
    env = dict(_pairs(parser, args.env, "--env"))
    token = os.environ.get(TOKEN_ENV) or None
    # the progress lines say what the client's log would (a busy worker): not twice
    logging.getLogger("kernel_worker.client").addHandler(logging.NullHandler())
    progress = _Progress(sys.stdout, sys.stderr)
    try:
        with Client(args.url, token=token, on_progress=progress) as client:
            result = client.run(source, inputs, timeout_seconds=args.timeout, env=env)
    except ValueError as exc:  # a malformed --url
        parser.error(str(exc))
    except ClientError as exc:
        progress.clear()
        print(f"strata-kernel-worker run: {_failure(exc, args.timeout, token)}", file=sys.stderr)
        return EXIT_WORKER_FAILED
    progress.clear()
    _print_console(result, progress.shown)
    _print_value_and_outputs(result)
    if args.out is not None:
        try:
            _save(result, args.out)
        except OSError as exc:
            print(f"strata-kernel-worker run: cannot save into {args.out}: {exc}", file=sys.stderr)
            return EXIT_WORKER_FAILED
    return 0 if result.success else EXIT_CELL_ERROR


def _read_source(parser: argparse.ArgumentParser, cell: str) -> str:
    try:
        return sys.stdin.read() if cell == "-" else Path(cell).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        parser.error(f"cannot read the cell {cell}: {exc}")


def _pairs(
    parser: argparse.ArgumentParser, items: Sequence[str], flag: str
) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"{flag} takes NAME=VALUE, not {item!r}")
        pairs.append((name, value))
    return pairs


# ---- inputs from files ---------------------------------------------------------------


def _frame(table: Any) -> object:  # a pyarrow.Table (pyarrow has no type hints)
    """A pandas DataFrame from a pyarrow Table when pandas is installed, else the Table."""
    return table if importlib.util.find_spec("pandas") is None else table.to_pandas()


def _parquet(path: Path) -> object:
    import pyarrow.parquet as pq

    return _frame(pq.read_table(path))


def _csv(path: Path) -> object:
    import pyarrow.csv as pcsv

    return _frame(pcsv.read_csv(path))


def _arrow(path: Path) -> object:
    import pyarrow as pa
    import pyarrow.feather as feather

    try:
        return _frame(feather.read_table(path))
    except pa.ArrowInvalid:  # not the file format: an IPC stream
        with pa.OSFile(str(path)) as source:
            return _frame(pa.ipc.open_stream(source).read_all())


def _json(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


def _npy(path: Path) -> object:
    import numpy as np

    return np.load(path, allow_pickle=False)


def _pickle(path: Path) -> object:
    return EncodedInput("pickle/object", path.read_bytes())


_READERS: dict[str, Callable[[Path], object]] = {
    ".parquet": _parquet,
    ".pq": _parquet,
    ".csv": _csv,
    ".arrow": _arrow,
    ".feather": _arrow,
    ".ipc": _arrow,
    ".json": _json,
    ".npy": _npy,
    ".pickle": _pickle,
    ".pkl": _pickle,
}


def _load(parser: argparse.ArgumentParser, name: str, raw: str) -> object:
    path = Path(raw)
    if path.is_dir():
        parser.error(f"--input {name}={raw} is a folder: the command line sends files")
    if not path.exists():  # (a pipe or a device is read as a file)
        parser.error(f"--input {name}={raw}: no such file")
    reader = _READERS.get(path.suffix.lower())
    try:
        if reader is not None:
            return reader(path)
        return EncodedInput("file/path", path.read_bytes(), f"{name}{path.suffix}")
    except ImportError as exc:
        parser.error(f"reading {raw} needs {exc.name}, which is not installed")
    except Exception as exc:  # any reader's own error: the file is not what its name says
        parser.error(f"cannot read input {raw}: {exc}")


# ---- results -------------------------------------------------------------------------


class _Progress:
    """Shows a waiting cell on the terminal: busy waits, its console as it comes, and how
    long it has been queued or running (a line kept up to date on a terminal, else one
    after 5 s and every 10 s after that). ``shown``: console characters already printed."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self._out, self._err = out, err
        self._tty = err.isatty()
        self._status_shown = False  # a status line waits to be overwritten (terminal)
        self._last_status: float | None = None
        self.shown = {"stdout": 0, "stderr": 0}

    def __call__(self, progress: Progress) -> None:
        if progress.state == "busy":
            self.clear()
            print(
                f"[worker busy: {progress.detail}; sending the cell again in "
                f"{progress.retry_in_seconds:g}s]",
                file=self._err, flush=True,
            )  # fmt: skip
            return
        if progress.stdout or progress.stderr or progress.missed:
            self.clear()
            if progress.missed:
                self._err.write(f"[{progress.missed} characters of console not shown]\n")
            self._out.write(progress.stdout)
            self._out.flush()
            self._err.write(progress.stderr)
            self._err.flush()
            self.shown["stdout"] += len(progress.stdout)
            self.shown["stderr"] += len(progress.stderr) + progress.missed
        self._status(progress)

    def _status(self, progress: Progress) -> None:
        what = progress.phase or {"waiting": "waiting for the worker"}.get(
            progress.state, progress.state
        )
        line = f"[{what}: {progress.elapsed_seconds:.0f}s]"
        if self._tty:
            self._err.write(f"\r{line}\x1b[K")
            self._err.flush()
            self._status_shown = True
        elif progress.elapsed_seconds >= _STATUS_EVERY_SECONDS / 2 and (
            self._last_status is None
            or progress.elapsed_seconds - self._last_status >= _STATUS_EVERY_SECONDS
        ):
            print(line, file=self._err, flush=True)
            self._last_status = progress.elapsed_seconds

    def clear(self) -> None:
        """Take the status line off the terminal before anything else is written."""
        if self._status_shown:
            self._err.write("\r\x1b[K")
            self._err.flush()
            self._status_shown = False


def _failure(exc: ClientError, timeout_seconds: float, token: str | None) -> str:
    """What went wrong, with a hint in this command's own terms."""
    if isinstance(exc, CellTimeout):
        return (
            f"the cell ran past its timeout ({timeout_seconds:g}s); "
            "give it longer with --timeout SECONDS"
        )
    if isinstance(exc, RequestFailed) and exc.status_code == 401:
        if token is None:
            return f"the worker wants a token ({exc.detail}): set {TOKEN_ENV} to it"
        return f"the worker refused the token in {TOKEN_ENV} ({exc.detail})"
    return str(exc)


def _print_console(result: CellResult, shown: dict[str, int]) -> None:
    """What of the console was not printed while the cell ran, then its error."""
    sys.stdout.write(result.stdout[shown["stdout"] :])
    sys.stdout.flush()
    sys.stderr.write(result.stderr[shown["stderr"] :])
    if not result.success:
        sys.stderr.write(result.traceback or f"{result.error_type}: {result.error}\n")
    sys.stderr.flush()


def _print_value_and_outputs(result: CellResult) -> None:
    """The last expression's value on stdout (as Jupyter shows it); a line per output on
    stderr: its name, format and preview."""
    for display in result.displays:
        text = display.formats.get("text/plain")
        if display.output_type == "execute_result" and isinstance(text, str):
            print(text)
    sys.stdout.flush()
    named = {name: meta for name, meta in result.variables.items() if name != "_"}
    for name, meta in named.items():
        if "error" in meta:
            print(f"output {name}: not serialized: {meta['error']}", file=sys.stderr)
            continue
        print(f"output {name}: {meta.get('content_type', '?')}{_preview(meta)}", file=sys.stderr)
    sys.stderr.flush()


def _preview(meta: Any) -> str:
    shape = ""
    if isinstance(meta.get("rows"), int):
        columns = meta.get("columns")
        width = f" x {len(columns)}" if isinstance(columns, list) else ""
        shape = f" ({meta['rows']} rows{width})"
    preview = meta.get("preview")
    if preview is None:
        return shape
    text = preview if isinstance(preview, str) else json.dumps(preview, default=str)
    text = " ".join(text.split())
    if len(text) > _PREVIEW_CHARS:
        text = text[: _PREVIEW_CHARS - 1] + "…"
    return f"{shape} = {text}"


def _save(result: CellResult, out: Path) -> None:
    """The bundle as it came: every path its manifest names is there."""
    written = 0
    for member, data in result.files.items():
        path = PurePosixPath(member)
        if path.is_absolute() or ".." in path.parts or member == "manifest.json":
            continue  # (no worker sends such a name; never written outside DIR)
        target = out.joinpath(*path.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written += 1
    for name in ("stdout.txt", "stderr.txt"):  # also when the bundle names them otherwise
        if not (out / name).exists():
            text = result.stdout if name == "stdout.txt" else result.stderr
            (out / name).write_text(text, encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(result.manifest, indent=2), encoding="utf-8")
    print(
        f"saved the bundle ({written} files, manifest.json) to {out}: "
        f"{len(result.variables)} outputs, {len(result.displays)} displays",
        file=sys.stderr,
    )
