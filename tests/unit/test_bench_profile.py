"""``bench.profile``'s reading of py-spy's collapsed stacks: who did the work, and in what.

The sampling itself needs py-spy and ptrace rights, so it is run by hand (``python -m
bench.profile``); these tests check the reading of its output format, which decides every
figure the report prints.
"""

from __future__ import annotations

import sys

import pytest

from bench import profile

CLIENT = 'process 10:"/venv/bin/python -m bench.profile --cases trivial"'
WORKER = 'process 11:"/venv/bin/python -m kernel_worker --port 1; --pool-size 2"'
KERNEL = 'process 12:"/venv/bin/python -m ipykernel_launcher -f /tmp/k1/connection.json"'
SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"


def _record(processes: list[str], frames: list[str], count: int) -> str:
    return ";".join([*processes, *frames]) + f" {count}\n"


def test_records_are_split_by_process_even_when_a_command_line_spans_lines() -> None:
    multiline = 'process 13:"/venv/bin/python -c import time\nwhile 1: time.sleep(1 2)"'
    text = (
        _record([CLIENT], [f"<module> ({SITE}/httpx/_client.py:5)"], 7)
        + _record([CLIENT, WORKER, KERNEL], [f"run ({SITE}/matplotlib/axes/_base.py:9)"], 3)
        + _record([CLIENT, multiline], [f"spin (<string>:{2})"], 4)
        + _record([CLIENT, WORKER], [], 1)
    )
    samples = profile.parse_collapsed(text)
    assert [s.count for s in samples] == [7, 3, 4, 1]
    assert samples[1].processes == (CLIENT[12:-1], WORKER[12:-1], KERNEL[12:-1])
    assert samples[2].processes[1] == "/venv/bin/python -c import time\nwhile 1: time.sleep(1 2)"
    assert samples[2].frames == ("spin (<string>:2)",)
    assert samples[3].frames == ()
    assert [profile.role_of(s.processes) for s in samples] == [
        "client", "kernel", "worker", "worker",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "library"),
    [
        (f"{SITE}/numpy/_core/fromnumeric.py", "numpy"),
        (f"{SITE}/zmq/sugar/socket.py", "zmq"),
        (f"{SITE}/six.py", "six"),
        (f"{STDLIB}/asyncio/selector_events.py", "stdlib:asyncio"),
        (f"{STDLIB}/json/__init__.py", "stdlib:json"),
        (f"{STDLIB}/selectors.py", "stdlib:selectors"),
        ("/src/project/kernel_worker/http/app.py", "kernel_worker"),
        ("/src/project/kernel_pool/pool.py", "kernel_pool"),
        ("<kernel_pool_inkernel.restore>", "agent"),
        ("<strata_kernel_agent.codecs>", "agent"),
        ("<string>", "cell"),
        ("/tmp/ipykernel_4242/3405691582.py", "cell"),
    ],
)
def test_a_frame_is_charged_to_the_library_its_file_belongs_to(path: str, library: str) -> None:
    assert profile.library_of(f"func ({path}:12)") == library


def test_the_report_charges_work_by_role_and_leaves_waits_out() -> None:
    mpl = f"Axes.__init__ ({SITE}/matplotlib/axes/_base.py:633)"
    cell = "<module> (/tmp/ipykernel_7/1.py:3)"
    select = f"EpollSelector.select ({STDLIB}/selectors.py:468)"
    pipe = f"OutStream._watch_pipe_fd ({SITE}/ipykernel/iostream.py:600)"
    h11 = f"Connection.send ({SITE}/h11/_connection.py:500)"
    samples = profile.parse_collapsed(
        _record([CLIENT, WORKER, KERNEL], [cell, mpl], 60)
        + _record([CLIENT, WORKER, KERNEL], [cell], 20)
        + _record([CLIENT, WORKER, KERNEL], [select], 500)
        + _record([CLIENT, WORKER, KERNEL], [pipe], 500)
        + _record([CLIENT], [h11], 10)
    )
    report = profile.summarize_samples(
        samples, cpu_seconds={"client": 0.2, "worker": 0.1, "kernel": 1.6}, requests=80
    )
    kernel = report["kernel"]
    assert kernel["samples"] == 80
    assert kernel["cpu_ms_per_request"] == pytest.approx(20.0)
    assert kernel["libraries"] == {"matplotlib": 0.75, "cell": 0.25}
    assert list(kernel["functions"]) == [
        "Axes.__init__ (matplotlib/_base.py)", "<module> (cell/1.py)",
    ]  # fmt: skip
    assert report["client"]["libraries"] == {"h11": 1.0}
    assert report["client"]["cpu_ms_per_request"] == pytest.approx(2.5)
    assert report["worker"]["samples"] == 0
    assert report["worker"]["libraries"] == {}


def test_unknown_cases_and_bad_settings_are_refused() -> None:
    with pytest.raises(profile.BenchError, match="unknown case"):
        profile._cases(["trivial", "no_such_case"])
    with pytest.raises(SystemExit) as exited:
        profile.main(["--rate", "0", "--py-spy", sys.executable])
    assert exited.value.code == 2
