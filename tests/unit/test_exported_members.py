"""Each package's exported names, pinned: a change to them is a change to its API."""

from __future__ import annotations

import importlib
import pathlib
from types import ModuleType

import pytest

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


# kernel_worker's other packages; those exporting nothing are namespaces of modules
WORKER_EXPORTS = {
    "kernel_worker": ["__version__"],
    "kernel_worker.client": [
        "AsyncClient",
        "CellError",
        "CellResult",
        "CellTimeout",
        "Client",
        "ClientError",
        "Display",
        "EncodedInput",
        "InputEncodingError",
        "OutputDecodingError",
        "Outputs",
        "Progress",
        "ProtocolError",
        "RequestFailed",
        "WorkerUnreachable",
    ],
    "kernel_worker.environments": [
        "KERNEL_REQUIREMENTS",
        "BuiltEnvironment",
        "EnvironmentBuildError",
        "EnvironmentOrigin",
        "EnvironmentSpec",
        "EnvironmentSpecError",
        "EnvironmentStore",
        "EnvironmentUsage",
        "LockedEnvironmentError",
        "SourceBuildRefused",
        "archive_url",
        "default_registry_url",
        "default_root",
        "lock_key",
        "parse_environment",
        "probe_uv",
    ],
    "kernel_worker.http": [],
    "kernel_worker.mounts": [],
    "kernel_worker.options": [
        "ENV_PREFIX",
        "GROUPS",
        "OPTIONS",
        "SETTINGS",
        "Option",
        "Setting",
        "documented_names",
        "reference",
    ],
    "kernel_worker.protocol": [],
    "kernel_worker.pull": [],
    "kernel_worker.runs": [],
    "kernel_worker.tracing": [
        "OFF",
        "TRACE_CONTEXT_KEYS",
        "Attributes",
        "Span",
        "Tracing",
        "Value",
        "from_environ",
        "trace_context",
    ],
}


@pytest.mark.parametrize("name", WORKER_EXPORTS)
def test_the_worker_packages_export(name: str) -> None:
    assert importlib.import_module(name).__all__ == WORKER_EXPORTS[name]


def test_every_package_is_pinned() -> None:
    """A package added to either tree gets its exports pinned here too."""
    pinned = {
        *WORKER_EXPORTS, "kernel_pool", "kernel_pool.forkserver", "kernel_pool.inkernel",
        "kernel_worker.agent", "kernel_worker.languages", "kernel_worker.languages.r",
    }  # fmt: skip
    assert sorted(_packages()) == sorted(pinned)


def _packages() -> list[str]:
    found = []
    for root in (kernel_pool, importlib.import_module("kernel_worker")):
        base = pathlib.Path(root.__file__ or "").parent
        for init in base.rglob("__init__.py"):
            parts = init.parent.relative_to(base.parent).parts
            if "__pycache__" not in parts:
                found.append(".".join(parts))
    return found


def test_every_exported_name_exists() -> None:
    packages: list[ModuleType] = [kernel_worker.languages, kernel_worker.languages.r]
    packages += [importlib.import_module(name) for name in WORKER_EXPORTS]
    for package in (kernel_pool, kernel_pool.forkserver, kernel_pool.inkernel, kernel_worker.agent,
                    *packages):  # fmt: skip
        assert [name for name in package.__all__ if not hasattr(package, name)] == []
