"""Marking a matrix ``slow`` but for a representative few, which the quick loop still runs.

``pytest -m "not slow"`` (docs/testing.md) keeps the loop under two minutes; the full run
(``python -m pytest``, what CI runs) takes every case. A matrix whose cases each start or
reuse kernels is written ``parametrize("name", quick_subset(names, quick=...))``: the
cases in ``quick`` run in both, the others only in the full run.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import pytest


def quick_subset(values: Iterable[Any], quick: Collection[Any]) -> list[Any]:
    """``values`` as parameters, each marked ``slow`` unless it is in ``quick``."""
    values = list(values)
    missing = [v for v in quick if v not in values]
    assert not missing, f"quick cases that are not in the matrix: {missing}"
    return [pytest.param(v, marks=() if v in quick else pytest.mark.slow) for v in values]


def full_run_only(value: Any) -> Any:
    """``value`` as a parameter marked ``slow``: the other path of a two-way matrix (spawned
    beside forked kernels, the full reset beside the inline one), which the quick loop
    leaves to the full run."""
    return pytest.param(value, marks=pytest.mark.slow)
