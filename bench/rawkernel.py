"""The floor: one ipykernel driven by jupyter_client directly (no pool, no HTTP).

Started the way the pool starts its kernels (same interpreter, IPC transport in a private
directory, history off, inline matplotlib), so the pool's and the worker's overhead is
measured against exactly the round trip they cannot avoid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

_SPEC_NAME = "bench-raw-python"


@dataclass(frozen=True, slots=True)
class RawReply:
    """An execution's reply content and its IOPub outputs as ``(msg_type, content)``."""

    reply: Mapping[str, Any]
    outputs: tuple[tuple[str, Mapping[str, Any]], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.reply.get("status") == "ok"

    def has_png(self) -> bool:
        return any(
            kind in ("display_data", "execute_result") and "image/png" in content.get("data", {})
            for kind, content in self.outputs
        )

    def problem(self) -> str | None:
        if self.ok:
            return None
        return f"{self.reply.get('ename', 'Error')}: {self.reply.get('evalue', '')}"


def _kernel_dirs(root: Path) -> list[str]:
    spec = root / "kernels" / _SPEC_NAME
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "bench raw", "language": "python"}),
        encoding="utf-8",
    )
    return [str(root / "kernels")]


class RawKernel:
    """One kernel process and its client; ``start`` then ``execute``, ``stop`` at the end."""

    def __init__(self, root: Path, name: str) -> None:
        self._root = root
        self._name = name
        self._km: Any = None
        self._kc: Any = None
        self.pid: int | None = None

    async def start(self, timeout_seconds: float = 120.0) -> None:
        ksm = KernelSpecManager(kernel_dirs=_kernel_dirs(self._root))
        self._km = AsyncKernelManager(
            kernel_name=_SPEC_NAME,
            kernel_spec_manager=ksm,
            connection_file=str(self._root / f"{self._name}.json"),
        )
        self._km.transport = "ipc"
        self._km.ip = str(self._root / self._name)
        env = dict(os.environ)
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env["IPYTHONDIR"] = str(self._root / "ipython")
        await self._km.start_kernel(
            env=env,
            extra_arguments=["--HistoryManager.enabled=False"],
        )
        self.pid = getattr(self._km.provisioner, "pid", None)
        self._kc = self._km.client()
        self._kc.start_channels()
        await self._kc.wait_for_ready(timeout=timeout_seconds)

    async def execute(self, code: str, *, deadline: float) -> RawReply:
        """Send one execute_request; return once its reply and its idle status arrived."""
        msg_id = self._kc.execute(code, allow_stdin=False, stop_on_error=False)
        reply: Mapping[str, Any] = {}
        while True:
            msg = await _next(self._kc.get_shell_msg, deadline)
            if msg["parent_header"].get("msg_id") == msg_id:
                reply = msg["content"]
                break
        outputs: list[tuple[str, Mapping[str, Any]]] = []
        while True:
            msg = await _next(self._kc.get_iopub_msg, deadline)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "status":
                if msg["content"].get("execution_state") == "idle":
                    return RawReply(reply, tuple(outputs))
            elif kind != "execute_input":
                outputs.append((kind, msg["content"]))

    async def stop(self) -> None:
        """Shut the kernel down; kill it by PID if it is still there."""
        if self._kc is not None:
            self._kc.stop_channels()
        if self._km is not None:
            with contextlib.suppress(Exception):  # already gone: nothing to shut down
                await self._km.shutdown_kernel(now=True)
        if self.pid is not None:
            await asyncio.to_thread(stop_pids, [self.pid])


async def _next(get: Any, deadline: float) -> Any:
    """The next message from one channel, or ``TimeoutError`` at the deadline."""
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0:
            raise queue.Empty
        return await get(timeout=remaining)
    except queue.Empty:
        raise TimeoutError("raw kernel execution ran past its deadline") from None


def stop_pids(pids: list[int], grace_seconds: float = 5.0) -> list[int]:
    """Terminate, then kill, each live process by PID; return the ones that had to be stopped."""
    procs: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                procs.append(proc)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_seconds)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_seconds)
    return [p.pid for p in procs]
