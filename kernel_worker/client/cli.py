"""``strata-kernel-worker run``: send one cell file to a running worker, for humans.

::

    strata-kernel-worker run cell.py --input df=data.parquet --url http://127.0.0.1:9000 --out out/

The cell's stdout and stderr are printed as they came back; a cell that raised prints its
traceback. With ``--out DIR`` the results are saved: ``DIR/outputs/<file>`` (each output as
the worker encoded it: ``.arrow`` is an Arrow IPC stream, ``.json``, ``.pickle``),
``DIR/displays/<n><ext>`` (every format of every display: ``0.png``, ``1.html``, ``1.txt``),
``DIR/stdout.txt``, ``DIR/stderr.txt`` and ``DIR/manifest.json``.

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
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from .session import CellResult, Client, ClientError, EncodedInput

__all__ = ["main"]

URL_ENV = "STRATA_KERNEL_WORKER_URL"
TOKEN_ENV = "STRATA_WORKER_TOKEN"
EXIT_CELL_ERROR = 1
EXIT_WORKER_FAILED = 3

_EXTENSIONS = {
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/svg+xml": ".svg",
    "text/html": ".html",
    "text/markdown": ".md",
    "text/latex": ".tex",
    "application/json": ".json",
    "application/javascript": ".js",
    "text/plain": ".txt",
}


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
    try:
        with Client(args.url, token=os.environ.get(TOKEN_ENV) or None) as client:
            result = client.run(source, inputs, timeout_seconds=args.timeout, env=env)
    except ValueError as exc:  # a malformed --url
        parser.error(str(exc))
    except ClientError as exc:
        print(f"strata-kernel-worker run: {exc}", file=sys.stderr)
        return EXIT_WORKER_FAILED
    _print_console(result)
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


def _print_console(result: CellResult) -> None:
    sys.stdout.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    if not result.success:
        sys.stderr.write(result.traceback or f"{result.error_type}: {result.error}\n")
    sys.stderr.flush()


def _save(result: CellResult, out: Path) -> None:
    (out / "outputs").mkdir(parents=True, exist_ok=True)
    (out / "displays").mkdir(exist_ok=True)
    (out / "stdout.txt").write_text(result.stdout, encoding="utf-8")
    (out / "stderr.txt").write_text(result.stderr, encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(result.manifest, indent=2), encoding="utf-8")
    saved = 0
    for name, meta in result.variables.items():
        if "error" in meta:
            print(f"output {name!r} was not serialized: {meta['error']}", file=sys.stderr)
            continue
        file_name = PurePosixPath(str(meta.get("file") or name)).name
        (out / "outputs" / file_name).write_bytes(result.outputs.encoded(name).data)
        saved += 1
    for index, display in enumerate(result.displays):
        for content_type, data in display.formats.items():
            target = out / "displays" / f"{index}{_EXTENSIONS.get(content_type, '.bin')}"
            if isinstance(data, str):
                target.write_text(data, encoding="utf-8")
            else:
                target.write_bytes(data)
    print(f"saved {saved} outputs and {len(result.displays)} displays to {out}", file=sys.stderr)
