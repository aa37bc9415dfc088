"""``python -m kernel_worker.options [FILE]``: print the configuration reference's tables, or
rewrite them in FILE between its ``<!-- options -->`` and ``<!-- /options -->`` lines."""

from __future__ import annotations

import sys
from pathlib import Path

from . import reference

BEGIN, END = "<!-- options -->", "<!-- /options -->"


def _rewrite(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    head, begin, rest = text.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section to rewrite")
    path.write_text(head + begin + reference() + end + tail, encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        _rewrite(Path(sys.argv[1]))
    else:
        sys.stdout.write(reference())
