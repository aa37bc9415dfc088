"""The one rule for an envelope's fields (README, "What a request may carry"), over HTTP.

A field left out or sent as ``null`` gets its default; a field the worker reads must hold
its JSON type, or one of the two conversions the reference makes (a numeric string for
``timeout_seconds``, a number or boolean as an ``env`` value); a field it does not read is
ignored. Anything else is a ``400`` whose ``detail`` names the field.

:data:`CASES` pins each case the rule was decided on, beside what the reference worker
answers (checked against it when the interop environment exists). The property test
draws whole envelopes whose fields hold values of every JSON type and checks each answer
against the rule: an accepted run whose cell saw exactly what was sent (nothing dropped), or
a 400 naming a field the rule refuses; never a 500 but the reference's for a malformed
locked environment (``environment``, checked after every other field).
"""

from __future__ import annotations

import io
import json
import keyword
import math
import os
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import WorkerProcess, free_port, stop_process
from tests.wire import read_bundle

# The cell of every accepted run: it reports what reached it.
REPORT = (
    "import os\n"
    "env_seen = {k: v for k, v in os.environ.items() if k.startswith('SKW_RULE_')}\n"
    "tables_seen = {n: [globals()[n], globals()[n + '_snapshot']]\n"
    "               for n in ('tab_a', 'tab_b') if n in globals()}\n"
)
EXAMPLES = int(os.environ.get("ENVELOPE_RULE_EXAMPLES", "250"))
RULE = settings(
    max_examples=EXAMPLES, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                           HealthCheck.filter_too_much],
)  # fmt: skip
ABSENT = object()  # a field left out of the envelope


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=worker.url, timeout=60) as c:
        yield c


def post(client: httpx.Client, route: str, metadata: object) -> httpx.Response:
    body = json.dumps(metadata, allow_nan=False).encode()
    return client.post(route, files={"metadata": ("metadata.json", body, "application/json")})


def v1(params: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    envelope: dict[str, Any] = {
        "protocol_version": "v1",
        "transform": {"ref": "notebook_cell@v1", "params": {"source": REPORT, **(params or {})}},
        "inputs": [],
    }
    envelope.update(top)
    return envelope


# ---- the decided cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One envelope, what this worker answers, and what the reference worker answers."""

    envelope: dict[str, Any]
    status: int  # ours
    says: str  # ours: a detail's start, or the env the cell saw (as JSON) on 200
    reference: str  # the reference's status ("a|b": either), "+ cell error" when its cell failed


CASES = {
    # timeout_seconds: a number of seconds above 0, or text spelling one
    "timeout 0": Case(v1({"timeout_seconds": 0}), 400, "timeout_seconds must be greater than 0", "408"),
    "timeout -1": Case(v1({"timeout_seconds": -1}), 400, "timeout_seconds must be greater than 0", "408"),
    "timeout 1e-9": Case(v1({"timeout_seconds": 1e-9}), 408, "Cell execution timed out after 1e-09s", "408"),
    "timeout '30'": Case(v1({"timeout_seconds": "30"}), 200, "{}", "200"),
    "timeout 'soon'": Case(v1({"timeout_seconds": "soon"}), 400, "timeout_seconds must be a number", "500"),
    "timeout true": Case(v1({"timeout_seconds": True}), 400, "timeout_seconds must be a number", "200|408"),  # 1 s: its cell process may not start in time
    "timeout 'inf'": Case(v1({"timeout_seconds": "inf"}), 400, "timeout_seconds must be finite", "200"),
    "timeout null": Case(v1({"timeout_seconds": None}), 200, "{}", "500"),
    "timeout []": Case(v1({"timeout_seconds": []}), 400, "timeout_seconds must be a number", "500"),
    # env: text, or a number or boolean written as the reference writes it
    "env number": Case(v1({"env": {"SKW_RULE_N": 4}}), 200, '{"SKW_RULE_N": "4"}', "200"),
    "env float": Case(v1({"env": {"SKW_RULE_F": 2.5}}), 200, '{"SKW_RULE_F": "2.5"}', "200"),
    "env boolean": Case(v1({"env": {"SKW_RULE_B": True}}), 200, '{"SKW_RULE_B": "True"}', "200"),
    "env value null": Case(v1({"env": {"SKW_RULE_A": None}}), 400, "env value of SKW_RULE_A must be", "200"),
    "env value list": Case(v1({"env": {"SKW_RULE_A": [1]}}), 400, "env value of SKW_RULE_A must be", "200"),
    "env list": Case(v1({"env": []}), 400, "env must be an object", "200 + cell error"),
    "env null": Case(v1({"env": None}), 200, "{}", "200 + cell error"),
    # fields the worker does not read: ignored, as by the reference
    "outputs 5": Case(v1(outputs=5), 200, "{}", "200"),
    "params.outputs 5": Case(v1({"outputs": 5}), 200, "{}", "200"),
    # the others: their JSON type, null for the default
    "source 5": Case(v1({"source": 5}), 400, "source must be a string", "200"),
    "source null": Case(v1({"source": None}), 200, "", "200"),
    "mounts null": Case(v1({"mounts": None}), 200, "{}", "400"),
    "mounts {}": Case(v1({"mounts": {}}), 400, "mounts must be a list", "400"),
    "mutation_defines 'x'": Case(v1({"mutation_defines": "x"}), 400, "mutation_defines must be", "200"),
    "tables 5": Case(v1({"tables": 5}), 400, "tables must be an object", "200 + cell error"),
    "build_id 5": Case(v1(build_id=5), 400, "build_id must be a string", "200"),
    "language null": Case(v1({"language": None}), 200, "{}", "200"),
    "language 5": Case(v1({"language": 5}), 400, "language must be a string", "400"),
    "protocol_version null": Case(v1(protocol_version=None), 200, "{}", "400"),
    "transform null": Case(v1(transform=None), 400, "Unsupported transform", "500"),
    "inputs null": Case(v1(inputs=None), 200, "{}", "400"),
    "inputs {}": Case(v1(inputs={}), 400, "inputs must be a list", "400"),
}  # fmt: skip


def check_ours(case: Case, response: httpx.Response) -> None:
    assert response.status_code == case.status, response.text
    if case.status != 200:
        assert str(response.json()["detail"]).startswith(case.says), response.text
        return
    bundle = read_bundle(response)
    assert bundle.manifest["success"] is True, bundle.manifest
    if case.says:  # a blank cell (source null) reports nothing
        assert bundle.variables["env_seen"]["preview"] == json.loads(case.says)


@pytest.mark.parametrize("name", list(CASES))
def test_each_decided_case(client: httpx.Client, name: str) -> None:
    check_ours(CASES[name], post(client, "/v1/execute", CASES[name].envelope))


# ---- the reference, where the interop environment exists ----------------------------------------


def _reference_worker() -> Path | None:
    python = os.environ.get("STRATA_INTEROP_PYTHON")
    worker = Path(python).with_name("strata-worker") if python else None
    return worker if worker is not None and worker.exists() else None


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    executable = _reference_worker()
    if executable is None:
        pytest.skip("no reference worker: set STRATA_INTEROP_PYTHON (scripts/interop-env.sh)")
    port = free_port()
    log = tmp_path_factory.mktemp("reference") / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(executable), "--host", "127.0.0.1", "--port", str(port)], stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the reference worker did not start"
            time.sleep(0.1)
        yield url
    finally:
        stop_process(proc, 10)


@pytest.mark.interop
@pytest.mark.parametrize("name", list(CASES))
def test_the_reference_answers_as_recorded(reference: str, name: str) -> None:
    """What each case was decided against: the reference worker's own answer."""
    case = CASES[name]
    with httpx.Client(base_url=reference, timeout=60) as ref:
        response = post(ref, "/v1/execute", case.envelope)
    statuses, _, note = case.reference.partition(" + ")
    assert str(response.status_code) in statuses.split("|"), response.text[:300]
    if response.status_code == 200:
        with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
            member = tar.extractfile("manifest.json")
            assert member is not None
            manifest = json.load(member)
        assert manifest["success"] is (note != "cell error"), manifest


# ---- the property: whole envelopes, fields of every JSON type ------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)  # JSON has no NaN or Infinity
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
TIMEOUT_FLOOR = 5.0  # a smaller positive limit is a real timeout (408), not this property's case


def _seconds(value: object) -> float | None:
    """``timeout_seconds`` as the rule reads it, or None when it refuses it."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def valid_env(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    return all(
        key and "=" not in key and "\x00" not in key
        and (isinstance(v, bool | int | float) or (isinstance(v, str) and "\x00" not in v))
        for key, v in value.items()
    )  # fmt: skip


def valid_tables(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    return all(
        name.isidentifier() and not keyword.iskeyword(name)
        and isinstance(table, dict) and isinstance(table.get("uri"), str)
        and (table.get("snapshot_id") is None
             or (isinstance(table["snapshot_id"], int) and not isinstance(table["snapshot_id"], bool)))
        for name, table in value.items()
    )  # fmt: skip


# field -> (is the value valid under the rule, words one of which the detail must hold)
Check = Callable[[object], bool]
FIELDS: dict[str, tuple[Check, tuple[str, ...]]] = {
    "protocol_version": (lambda v: v == "v1", ("protocol version",)),
    "build_id": (lambda v: isinstance(v, str), ("build_id",)),
    "inputs": (lambda v: v == [], ("input",)),
    "source": (lambda v: isinstance(v, str), ("source",)),
    "timeout_seconds": (lambda v: _seconds(v) is not None, ("timeout_seconds",)),
    "env": (valid_env, ("env",)),
    "mounts": (lambda v: v == [], ("mount",)),
    "mutation_defines": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), ("mutation_defines",)),
    "tables": (valid_tables, ("table",)),
    "language": (lambda v: v in ("", "python"), ("language",)),
    "environment": (lambda v: False, ("environment",)),
    "transform": (lambda v: False, ("transform",)),  # drawn only as a value replacing it
    "params": (lambda v: isinstance(v, dict), ("transform.params",)),
}  # fmt: skip
TOP = ("protocol_version", "build_id", "inputs")


def not_a_short_timeout(value: object) -> bool:
    seconds = _seconds(value)
    return seconds is None or seconds >= TIMEOUT_FLOOR


env_name = st.from_regex(r"SKW_RULE_[A-Z0-9_]{0,6}", fullmatch=True)
table = st.fixed_dictionaries(
    {"uri": st.text(max_size=10)}, optional={"snapshot_id": st.none() | st.integers()}
)
VALID: dict[str, st.SearchStrategy[Any]] = {
    "protocol_version": st.just("v1"),
    "build_id": st.text(max_size=10),
    "inputs": st.just([]),
    "source": st.just(REPORT),
    "timeout_seconds": st.floats(TIMEOUT_FLOOR, 1e9) | st.integers(5, 10**9).map(str),
    "env": st.dictionaries(env_name, st.text(max_size=8) | st.integers() | st.booleans()
                           | st.floats(allow_nan=False, allow_infinity=False), max_size=3),
    "mounts": st.just([]),
    "mutation_defines": st.lists(st.text(max_size=6), max_size=3),
    "tables": st.dictionaries(st.sampled_from(["tab_a", "tab_b"]), table, max_size=2),
    "language": st.sampled_from(["python", ""]),
}  # fmt: skip
UNKNOWN = st.dictionaries(
    st.sampled_from(["outputs", "tenant", "origin", "future_field"]), json_values, max_size=2
)


def field_value(name: str, *, clean: bool) -> st.SearchStrategy[Any]:
    """Left out, a valid value, null, or (unless ``clean``) any JSON value at all."""
    anything = json_values.filter(not_a_short_timeout) if name == "timeout_seconds" else json_values
    if name == "language":  # "r" runs on R kernels (tests/worker/test_r_cells.py), not here
        anything = json_values.filter(lambda v: v != "r")
    valid = VALID.get(name, st.nothing())
    if clean:  # half the envelopes: runs, whose cells must see what was sent
        return st.one_of(st.just(ABSENT), valid, st.none())
    return st.one_of(st.just(ABSENT), valid, anything)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(envelope, the fields as drawn, the fields the rule refuses)."""
    clean = draw(st.booleans())
    drawn = {
        name: draw(field_value(name, clean=clean))
        for name in FIELDS
        if name not in ("transform", "params")
    }
    params = {k: v for k, v in drawn.items() if k not in TOP and v is not ABSENT}
    params.update(draw(UNKNOWN))
    transform: Any = {"ref": "notebook_cell@v1", "params": params}
    shape = draw(st.sampled_from(["whole", "whole", "whole", "params", "transform"]))
    if shape == "params":  # the params object itself replaced by any value (of no field)
        drawn["params"] = transform["params"] = draw(json_values.filter(no_field_in))
    elif shape == "transform":
        drawn["transform"] = transform = draw(json_values)
    envelope = {k: v for k, v in drawn.items() if k in TOP and v is not ABSENT}
    envelope["transform"] = transform
    envelope.update(draw(UNKNOWN))
    return envelope, drawn, refused_fields(drawn, shape)


def no_field_in(value: object) -> bool:
    """Not an object holding a field the rule checks (a params object drawn whole)."""
    return not isinstance(value, dict) or not set(value) & set(FIELDS)


def refused_fields(drawn: dict[str, Any], shape: str) -> list[str]:
    """The fields the rule refuses: null or left out is the default, so never refused."""
    if shape == "transform":
        # null: no ref; anything but an object: refused as such (top fields come first)
        top = [f for f in TOP if not _accepted(f, drawn[f])]
        return [*top, "transform"]
    fields = [f for f in TOP if not _accepted(f, drawn[f])]
    if shape == "params" and drawn["params"] is not None:
        return [*fields, *([] if isinstance(drawn["params"], dict) else ["params"])]
    if shape == "params":
        return fields
    return [*fields, *(f for f in FIELDS if f not in (*TOP, "transform", "params")
                       and not _accepted(f, drawn[f]))]  # fmt: skip


def _accepted(name: str, value: object) -> bool:
    return value is ABSENT or value is None or FIELDS[name][0](value)


@RULE
@given(drawn=envelopes())
def test_every_envelope_is_a_run_of_what_was_sent_or_a_400_naming_a_field(
    client: httpx.Client, drawn: tuple[dict[str, Any], dict[str, Any], list[str]]
) -> None:
    envelope, fields, refused = drawn
    response = post(client, "/v1/execute", envelope)
    event(f"status {response.status_code}")
    if refused == ["environment"]:  # a malformed locked environment: the reference's 500
        assert response.status_code == 500, (response.status_code, response.text[:300])
        assert response.json()["error"].startswith("locked environment: ")
        return
    if refused:
        assert response.status_code == 400, (refused, response.status_code, response.text[:300])
        detail = response.json()["detail"].lower()
        words = [word for field in refused for word in FIELDS[field][1]]
        assert any(word in detail for word in words), (refused, detail)
        return
    assert response.status_code == 200, (envelope, response.text[:300])
    bundle = read_bundle(response)
    params = {} if "params" in fields else fields  # params drawn whole: none of the fields
    source = params.get("source", ABSENT)
    if source is not REPORT:  # any other text runs as it is, and may fail as Python
        assert "env_seen" not in bundle.variables
        assert bundle.manifest["success"] is (source in (ABSENT, None)), bundle.manifest
        return
    assert bundle.manifest["success"] is True, bundle.manifest
    assert bundle.variables["env_seen"]["preview"] == sent(params.get("env"), str)
    tables = sent(params.get("tables"), lambda t: [t["uri"], t.get("snapshot_id")])
    assert bundle.variables["tables_seen"]["preview"] == tables


def sent(value: object, shown: Callable[[Any], Any]) -> dict[str, Any]:
    """What the cell must have seen of an ``env`` or ``tables`` object (the names the
    report cell looks at), each value as it sees it: nothing dropped."""
    if not isinstance(value, dict):
        return {}  # left out or null
    return {
        name: shown(item)
        for name, item in value.items()
        if name.startswith("SKW_RULE_") or name in ("tab_a", "tab_b")
    }
