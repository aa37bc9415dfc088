"""Command-line and environment configuration."""

from __future__ import annotations

import contextlib
import platform
import socket
import subprocess
import sys
import time

import psutil
import pytest

from kernel_pool import RecyclePolicy
from kernel_worker.cli import keep_transfer_buffers, settings_from


def test_defaults() -> None:
    s = settings_from([], {})
    assert (s.host, s.port, s.pool_size, s.recycle) == ("127.0.0.1", 9000, 2, RecyclePolicy.RESET)
    assert s.timeout_status == 408 and s.token is None
    assert s.max_input_bytes == 2 * 1024**3
    assert s.kernel_start == "fork"


def test_token_binds_all_interfaces_unless_host_given() -> None:
    assert settings_from([], {"STRATA_WORKER_TOKEN": "t"}).host == "0.0.0.0"
    assert settings_from(["--host", "127.0.0.1"], {"STRATA_WORKER_TOKEN": "t"}).host == "127.0.0.1"


def test_environment_and_flags() -> None:
    env = {
        "STRATA_KERNEL_WORKER_POOL_SIZE": "3",
        "STRATA_KERNEL_WORKER_MAX_KERNEL_MEMORY": "2G",
        "STRATA_WORKER_MAX_INPUT_BYTES": "1000",
        "STRATA_KERNEL_WORKER_RECYCLE": "fresh",
        "STRATA_KERNEL_WORKER_KERNEL_START": "spawn",
        "STRATA_KERNEL_WORKER_BUNDLE_COMPRESSLEVEL": "6",
    }
    s = settings_from(["--pool-size", "4", "--timeout-status", "504"], env)
    assert s.pool_size == 4  # the flag wins
    assert s.max_kernel_memory == 2 * 1024**3
    assert s.max_input_bytes == 1000
    assert s.recycle is RecyclePolicy.FRESH
    assert s.timeout_status == 504
    assert s.kernel_start == "spawn"
    assert s.bundle_compresslevel == 6


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")
def test_transfer_buffers_are_kept_on_glibc() -> None:
    assert keep_transfer_buffers()


def test_gpu_slots_set_the_pool_size() -> None:
    s = settings_from([], {"STRATA_WORKER_GPU_SLOTS": "3"})
    assert s.gpu_slots == ("0", "1", "2") and s.pool_size == 3
    s = settings_from(["--gpu-slots", "1,3"], {})
    assert s.gpu_slots == ("1", "3") and s.pool_size == 2
    assert settings_from(["--gpu-slots", "2", "--pool-size", "4"], {}).pool_size == 4


def test_heartbeat_interval_from_the_reference_variable_or_the_flag() -> None:
    assert settings_from([], {}).heartbeat_seconds is None
    assert settings_from([], {"STRATA_WORKER_HEARTBEAT_SECONDS": "30"}).heartbeat_seconds == 30.0
    env = {"STRATA_WORKER_HEARTBEAT_SECONDS": "30"}
    assert settings_from(["--heartbeat-seconds", "2.5"], env).heartbeat_seconds == 2.5
    with pytest.raises(SystemExit):
        settings_from([], {"STRATA_WORKER_HEARTBEAT_SECONDS": "nan"})


def test_file_reuse_budget_from_the_flag_or_the_environment_and_zero_turns_it_off() -> None:
    assert settings_from([], {}).file_reuse_bytes == 256 * 1024 * 1024
    assert settings_from(["--file-reuse-bytes", "64M"], {}).file_reuse_bytes == 64 * 1024 * 1024
    env = {"STRATA_KERNEL_WORKER_FILE_REUSE_BYTES": "0"}
    assert settings_from([], env).file_reuse_bytes == 0


@pytest.mark.parametrize(
    "argv",
    [["--file-reuse-bytes", "-1"], ["--file-reuse-bytes", "lots"], ["--pool-size", "0"], ["--recycle", "sometimes"], ["--kernel-start", "exec"], ["--bundle-compresslevel", "10"], ["--timeout-status", "500"],
     ["--max-kernel-memory", "lots"], ["--preload", "/no/such/file.py"], ["--gpu-slots", "0"],
     ["--heartbeat-seconds", "0"], ["--heartbeat-seconds", "-5"], ["--heartbeat-seconds", "inf"],
     ["--port", "70000"], ["--port", "-1"], ["--metrics-port", "65536"],
     ["--queue-wait", "nan"], ["--job-ttl", "inf"], ["--drain-seconds", "-1"],
     ["--log-level", "verbose"], ["--port", "18897", "--metrics-port", "18897"]],
)  # fmt: skip
def test_bad_flags_exit_with_a_message(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        settings_from(argv, {})
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variable", "value"),
    [("STRATA_KERNEL_WORKER_QUEUE_WAIT", "nan"), ("STRATA_KERNEL_WORKER_LOG_LEVEL", "loud"),
     ("STRATA_NOTEBOOK_CREDENTIALS", "{bad"), ("STRATA_NOTEBOOK_MOUNT_CREDENTIALS", "[1]"),
     ("STRATA_NOTEBOOK_CREDENTIALS", '{"name": 1}')],
)  # fmt: skip
def test_bad_variables_exit_with_a_message_naming_them(
    variable: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        settings_from([], {variable: value})
    assert exc.value.code == 2
    assert variable in capsys.readouterr().err


def test_log_levels_are_read_in_any_case() -> None:
    assert settings_from(["--log-level", "DEBUG"], {}).log_level == "debug"
    assert settings_from([], {"STRATA_KERNEL_WORKER_LOG_LEVEL": "Warning"}).log_level == "warning"


def test_help_explains_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for flag in ("--pool-size", "--preload", "--recycle", "--max-uses", "--max-kernel-memory",
                 "--spares", "--gpu-slots", "--timeout-status", "--kernel-name", "--log-level"):  # fmt: skip
        assert flag in out
    assert "strata-kernel-worker run" in out  # the command line for one cell


def _failed_start(*args: str) -> str:
    """Start a worker that must fail to start: status 3, one line, no traceback; its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "kernel_worker", "--port", "0", "--pool-size", "1", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


@pytest.mark.slow
def test_preload_failure_stops_startup_with_its_message(tmp_path: pytest.TempPathFactory) -> None:
    """One line says what failed and where in the preload."""
    preload = tmp_path / "preload.py"  # type: ignore[operator]
    preload.write_text(
        "import os\ndef load():\n    raise RuntimeError('weights not found')\nload()\n"
    )
    stderr = _failed_start("--preload", str(preload))
    assert (
        f"the preload {preload} failed: RuntimeError: weights not found (line 3, in load)" in stderr
    ), stderr


@pytest.mark.slow
def test_a_preload_longer_than_the_start_timeout_stops_startup_with_one_line(
    tmp_path: pytest.TempPathFactory,
) -> None:
    preload = tmp_path / "slow.py"  # type: ignore[operator]
    preload.write_text("import time\ntime.sleep(30)\n")
    stderr = _failed_start("--preload", str(preload), "--kernel-start-timeout", "2")
    assert "did not finish within the kernel start timeout (2s)" in stderr, stderr


def test_the_kernel_start_timeout_allows_long_preloads() -> None:
    assert settings_from([], {}).kernel_start_timeout == 600.0  # a model may load for minutes
    env = {"STRATA_KERNEL_WORKER_KERNEL_START_TIMEOUT": "1800"}
    assert settings_from([], env).kernel_start_timeout == 1800.0
    with pytest.raises(SystemExit):
        settings_from(["--kernel-start-timeout", "0"], {})


def test_a_metrics_port_in_use_stops_startup_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stderr = _failed_start("--metrics-port", str(port))
    assert f"--metrics-port {port}: Address already in use" in stderr, stderr


def test_a_port_in_use_stops_the_worker_before_any_kernel_starts() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_worker", "--port", str(port), "--pool-size", "1"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        seen: set[int] = set()
        while proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                seen |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            time.sleep(0.01)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "address already in use" in stderr.lower()
    assert not seen, "kernels were started for a worker that could not listen"


def test_connection_and_upload_limits_from_flags_and_environment() -> None:
    s = settings_from([], {})
    limits = (s.header_timeout_seconds, s.send_timeout_seconds, s.max_connections, s.max_uploads)
    assert limits == (10.0, 60.0, 1024, 16)
    env = {
        "STRATA_KERNEL_WORKER_HEADER_TIMEOUT": "5",
        "STRATA_KERNEL_WORKER_SEND_TIMEOUT": "30",
        "STRATA_KERNEL_WORKER_MAX_CONNECTIONS": "200",
        "STRATA_KERNEL_WORKER_MAX_UPLOADS": "4",
    }
    s = settings_from(["--max-uploads", "8"], env)
    limits = (s.header_timeout_seconds, s.send_timeout_seconds, s.max_connections, s.max_uploads)
    assert limits == (5.0, 30.0, 200, 8)  # the flag wins


@pytest.mark.parametrize(
    ("hard", "fits"),
    [(4096, 1024), (600, 88)],  # room for all; else what the hard limit leaves (600 - 512)
)
def test_the_open_file_limit_is_raised_to_fit_the_connections(hard: int, fits: int) -> None:
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < hard:
        pytest.skip(f"this machine's hard open-file limit is under {hard}")
    code = (
        "import resource\n"
        "from kernel_worker.http.connections import fit_open_files\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, (256, {hard}))\n"
        "print(fit_open_files(1024), resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(fits), str(min(hard, 1024 + 512))]
