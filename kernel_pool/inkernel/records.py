"""What the settings parts recorded at the baseline, shared by the modules that restore
them (``modules``, ``registries``, ``display``, ``logs``, ``hooks``)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

RECORDED: dict[str, Any] = {}
"""Each part's recorded settings, by part."""
LIBRARY_STATE: dict[str, Any] = {}
"""Module name -> the settings recorded for that library."""


@contextlib.contextmanager
def quietly() -> Iterator[Any]:
    """Setting a deprecated option warns: that is not the next request's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
