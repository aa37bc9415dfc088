"""The run in progress in this kernel, and what the agent replaced in IPython to hook in.

One ``Run`` exists from a cell's ``pre_run_cell`` to the pool's reset; the modules that
bind inputs, record displays, collect outputs and label warnings all read it from here.
Stdlib only; shipped into kernels with the runtime.
"""

from __future__ import annotations

from typing import Any


class Run:
    """Per-request state; one exists between ``pre_run_cell`` and the pool's reset."""

    def __init__(self, plan: Any, source: str | None = None) -> None:
        self.plan = plan
        self.source = source  # the cell's text
        self.before: dict[str, int] = {}
        self.rebound: set[str] = set()  # names bound to the object they held (see rebinding)
        self.inputs: dict[str, Any] = {}
        self.fingerprints: dict[str, Any] = {}
        self.displays: list[Any] = []
        self.display_ids: dict[
            str, list[int]
        ] = {}  # display_id -> indices in displays (update_display replaces)
        self.clear_pending = False  # clear_output(wait=True): cleared by the next display
        self.recording = True
        self.formatting = 0  # > 0 while IPython formats a display (see displays.display)
        self.error: BaseException | None = None
        self.collected = False
        self.file_label: str | None = (
            None  # what warnings call the cell (see plain_process.cell_file_label)
        )


state: dict[str, Any] = {
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


def current() -> Any:
    """The run in progress, or None between runs."""
    return state["run"]


def current_plan() -> Any:
    """The plan of the run in progress, or None between runs."""
    run = state["run"]
    return None if run is None else run.plan
