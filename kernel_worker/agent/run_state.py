"""The run in progress in this kernel, and what the agent replaced in IPython to hook in.

One ``Run`` exists from a cell's ``pre_run_cell`` to the pool's reset; the modules that
bind inputs, record displays, collect outputs and label warnings all read it from here.
Stdlib only; shipped into kernels with the runtime.
"""


class Run:
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
        self.file_label = None  # what warnings call the cell (see plain_process.cell_file_label)


state = {
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


def current():
    """The run in progress, or None between runs."""
    return state["run"]


def current_plan():
    """The plan of the run in progress, or None between runs."""
    run = state["run"]
    return None if run is None else run.plan
