"""Each package's exported names, pinned: a change to them is a change to its API."""

from __future__ import annotations

import kernel_pool
import kernel_pool.forkserver
import kernel_pool.inkernel
import kernel_worker.agent
import kernel_worker.languages
import kernel_worker.languages.r


def test_kernel_pool_exports() -> None:
    assert kernel_pool.__all__ == [
        "DEFAULT_KIND",
        "STREAM_DROPPED_MSG_TYPE",
        "DurationSummary",
        "ExecuteResult",
        "ExecutionError",
        "ExecutionTimeout",
        "KernelDied",
        "KernelInitError",
        "KernelKind",
        "KernelNoReply",
        "KernelSetup",
        "KernelStartError",
        "KernelState",
        "KindPoolStats",
        "LanguageCode",
        "Lease",
        "Output",
        "Pool",
        "PoolBusy",
        "PoolClosed",
        "PoolConfig",
        "PoolError",
        "PoolMemory",
        "PoolSet",
        "PoolStats",
        "PreloadError",
        "ProcessMemory",
        "RecyclePolicy",
        "RetireReason",
        "ShippedPackage",
        "dropped_characters",
    ]


def test_the_fork_server_exports() -> None:
    assert kernel_pool.forkserver.__all__ == [
        "FORK_SERVER_SCRIPT",
        "ExitCallback",
        "ForkServer",
        "ForkedKernelProcess",
        "killed_with_kernel",
        "unwatch_and_close",
    ]


def test_the_in_kernel_package_exports() -> None:
    assert kernel_pool.inkernel.__all__ == [
        "KernelHooks",
        "before_kernel_app",
        "capture",
        "install",
        "mark_before_preload",
        "reset",
        "use_template_names",
    ]


def test_the_agent_exports() -> None:
    assert kernel_worker.agent.__all__ == ["AGENT_PACKAGE", "INSTALL"]


def test_the_languages_exports() -> None:
    assert kernel_worker.languages.__all__ == ["R_UNAVAILABLE", "RKernels", "run_r_cell"]
    assert kernel_worker.languages.r.__all__ == ["R_UNAVAILABLE", "RKernels", "run_r_cell"]


def test_every_exported_name_exists() -> None:
    packages = (kernel_worker.languages, kernel_worker.languages.r)
    for package in (kernel_pool, kernel_pool.forkserver, kernel_pool.inkernel, kernel_worker.agent,
                    *packages):  # fmt: skip
        assert [name for name in package.__all__ if not hasattr(package, name)] == []
