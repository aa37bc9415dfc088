"""The run plan: built once by the worker, complete, and read back by the agent as the same
typed value (it travels as JSON in the execute request's metadata)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kernel_worker.agent.plan import RunPlan, TableRef
from kernel_worker.execution import build_plan
from kernel_worker.protocol.envelopes import parse_execute_v1
from kernel_worker.runs.directory import RunDir
from kernel_worker.runs.limits import RunLimits

ENVELOPE = {
    "protocol_version": "v1",
    "transform": {
        "ref": "notebook_cell@v1",
        "params": {
            "source": "y = df.a.sum()",
            "env": {"MODEL": "bge", "N": 3},
            "mutation_defines": ["df"],
            "tables": {"t": {"uri": "strata://table/t", "snapshot_id": 7}},
        },
    },
    "inputs": [
        {"name": "df", "format": "arrow/ipc", "file": "df.arrow"},
        {
            "name": "helper",
            "format": "module/cell",
            "file": "helper.cell_module.json",
            "injected": {"n": {"content_type": "json/object", "file": "helper__inj__n.json"}},
        },
    ],
}


@pytest.fixture
def plan() -> RunPlan:
    run_dir = RunDir(Path("/runs/skw-run-1-abc"))  # building the plan touches no disk here
    return build_plan(
        parse_execute_v1(json.dumps(ENVELOPE).encode()),
        run_dir,
        env={"MODEL": "bge", "N": "3", "CUDA_VISIBLE_DEVICES": "1"},
        limits=RunLimits().for_kernel(),
        spares=[("/runs/skw-kept-1/a", 4096)],
        mounts={"data": "/mnt/data"},
    )


def test_the_plan_is_complete_when_built(plan: RunPlan) -> None:
    assert [spec.name for spec in plan.inputs] == ["df", "helper"]
    assert plan.inputs[0].path == "/runs/skw-run-1-abc/inputs/df.arrow"
    helper = plan.inputs[1]
    assert [(sub.name, sub.content_type) for sub in helper.injected] == [("n", "json/object")]
    assert helper.injected[0].path.startswith("/runs/skw-run-1-abc/inputs/")
    assert plan.env == {"MODEL": "bge", "N": "3", "CUDA_VISIBLE_DEVICES": "1"}
    assert plan.paths == {"data": "/mnt/data"}
    assert plan.work_dir == "/runs/skw-run-1-abc/work"
    assert plan.report_path.startswith("/runs/skw-run-1-abc/")
    assert plan.mutation_defines == ("df",)
    assert plan.tables == {"t": TableRef(uri="strata://table/t", snapshot_id=7)}
    assert plan.limits == RunLimits().for_kernel()
    assert plan.spares == (("/runs/skw-kept-1/a", 4096),)


def test_the_plan_cannot_be_changed_once_built(plan: RunPlan) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.work_dir = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.env["X"] = "1"  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.paths["x"] = "/tmp"  # type: ignore[index]


def test_the_agent_reads_back_what_the_worker_sent(plan: RunPlan) -> None:
    """Through JSON, as the kernel's message carries it."""
    sent = json.loads(json.dumps(plan.to_dict()))
    assert RunPlan.from_dict(sent) == dataclasses.replace(plan, env=dict(plan.env))


def test_the_wire_form_keeps_its_keys(plan: RunPlan) -> None:
    """The keys the agent has always been sent; ``spares`` only when there are some."""
    data = plan.to_dict()
    assert set(data) == {
        "inputs", "paths", "env", "work_dir", "files_dir", "display_dir", "report_path",
        "mutation_defines", "tables", "limits", "spares",
    }  # fmt: skip
    assert data["inputs"][0] == {
        "name": "df",
        "content_type": "arrow/ipc",
        "path": "/runs/skw-run-1-abc/inputs/df.arrow",
        "injected": [],
    }
    assert data["spares"] == [["/runs/skw-kept-1/a", 4096]]
    assert "spares" not in dataclasses.replace(plan, spares=()).to_dict()
    assert RunPlan.from_dict(dataclasses.replace(plan, spares=()).to_dict()).spares == ()


def test_the_names_a_request_binds(plan: RunPlan) -> None:
    assert plan.given_names() == {"df", "helper", "data", "t", "t_snapshot"}


def test_a_plan_missing_a_field_is_refused(plan: RunPlan) -> None:
    data = plan.to_dict()
    del data["report_path"]
    with pytest.raises(KeyError):
        RunPlan.from_dict(data)
