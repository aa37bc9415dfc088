"""Starting a kernel process: forked from the fork server, or spawned through jupyter_client.

Both give a :class:`KernelProcess`: the pid, the connection info and session to talk to it,
an exit notification, interrupt and stop. The native kernel (ipykernel of this interpreter)
is forked when the pool has a fork server; any other kernelspec is spawned by jupyter_client
from its ``argv``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from .errors import KernelStartError
from .forkserver import ExitCallback, ForkedKernelProcess, ForkServer, unwatch_and_close
from .processes import KernelIdentity
from .shipping import INKERNEL, ShippedPackage, load_code

ShutdownRequest = Callable[[], object]


class KernelProcess(abc.ABC):
    """A started kernel process."""

    connection_file: Path
    connection_info: Mapping[str, Any]
    session: Session
    has_agent = False
    """Whether the kernel starts with the shipped packages loaded (forked from the fork
    server, which loaded them)."""

    @property
    @abc.abstractmethod
    def pid(self) -> int | None: ...

    @abc.abstractmethod
    def watch(self, on_exit: ExitCallback) -> None:
        """Call ``on_exit(exit status or None)`` once, when the process has exited."""

    @abc.abstractmethod
    async def interrupt(self) -> None:
        """SIGINT to the kernel's process group."""

    @abc.abstractmethod
    async def stop(self, *, now: bool, grace: float, ask: ShutdownRequest | None) -> None:
        """Stop the process: at once, or asked (``ask``) and killed after ``grace`` seconds."""

    def forget_connection_file(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.connection_file)


class ForkedKernel(KernelProcess):
    """The native kernel, forked by the pool's fork server.

    No connection file: the kernel gets its socket paths in the fork request and makes its
    own key after the fork, which it sends back through a pipe only the pool reads.
    """

    has_agent = True

    def __init__(self, ipc_base: Path) -> None:
        self._ipc_base = ipc_base
        self._process: ForkedKernelProcess | None = None

    def forget_connection_file(self) -> None:
        pass  # it never had one

    async def start(
        self,
        fork_server: ForkServer,
        arguments: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        identity: KernelIdentity | None,
        packages: tuple[ShippedPackage, ...],
        deadline: float,
        template: str | None = None,
        template_timeout: float | None = None,
        environment: Mapping[str, Any] | None = None,
    ) -> None:
        connection: dict[str, Any] = {"transport": "ipc", "ip": str(self._ipc_base)}
        connection.update({name: number for number, name in enumerate(_CHANNEL_PORTS, 1)})
        read_end, write_end = os.pipe()
        try:
            self._process = await fork_server.spawn(
                list(arguments), env, str(cwd), identity, INKERNEL.name, load_code(packages),
                deadline,
                template, template_timeout, connection, write_end, environment,
            )  # fmt: skip
            os.close(write_end)
            write_end = -1
            key = await _read_key(read_end, deadline)
        finally:
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)
        self.connection_info = {**connection, "key": key, "signature_scheme": "hmac-sha256"}
        self.session = Session(key=key, signature_scheme="hmac-sha256")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def watch(self, on_exit: ExitCallback) -> None:
        if self._process is not None:
            self._process.watch(on_exit)

    async def interrupt(self) -> None:
        if self._process is not None:
            self._process.signal_group(signal.SIGINT)

    async def stop(self, *, now: bool, grace: float, ask: ShutdownRequest | None) -> None:
        process = self._process
        if process is None:
            return
        if not now and ask is not None and process.returncode is None:
            ask()
            if await process.wait(grace):
                return
        process.signal_group(signal.SIGKILL)
        await process.wait(grace)
        process.close()


_CHANNEL_PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


async def _read_key(fd: int, deadline: float) -> bytes:
    """The key a forked kernel sends through its pipe (its end closes once it is sent)."""
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KernelStartError("the forked kernel did not send its key in time")
        chunk = await asyncio.wait_for(asyncio.to_thread(os.read, fd, 128), remaining)
        if not chunk:
            break
        chunks.append(chunk)
    key = b"".join(chunks)
    if len(key) != 64:
        raise KernelStartError("the forked kernel exited before it sent its key")
    return key


class SpawnedKernel(KernelProcess):
    """A kernel from a kernelspec's ``argv``, started by jupyter_client."""

    def __init__(self, name: str, kernel_dirs: Sequence[Path] | None, kernel_dir: Path) -> None:
        ksm = (
            KernelSpecManager(kernel_dirs=[str(d) for d in kernel_dirs])
            if kernel_dirs is not None
            else KernelSpecManager()
        )
        self._name = name
        self.connection_file = kernel_dir / "connection.json"
        self._km = AsyncKernelManager(
            kernel_name=name, kernel_spec_manager=ksm, connection_file=str(self.connection_file)
        )
        self._km.transport = "ipc"  # unix sockets inside the kernel's private directory
        self._km.ip = str(kernel_dir / "ipc")
        self._pidfd: int | None = None

    async def start(
        self,
        arguments: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        identity: KernelIdentity | None,
        shutdown_timeout: float,
    ) -> None:
        self._km.shutdown_wait_time = shutdown_timeout
        kwargs: dict[str, Any] = {
            "env": dict(env), "extra_arguments": list(arguments), "cwd": str(cwd),
        }  # fmt: skip
        if identity is not None:
            # the connection file is written (and given to that user) before the launch
            self._km.write_connection_file()
            os.chown(self.connection_file, *identity)
            uid, gid = identity
            kwargs.update(user=uid, group=gid, extra_groups=[])
        try:
            await self._km.start_kernel(**kwargs)
        except NoSuchKernel as exc:
            raise KernelStartError(f"no such kernelspec: {self._name!r}") from exc
        except (OSError, ValueError, RuntimeError) as exc:
            raise KernelStartError(f"kernel process could not be started: {exc}") from exc
        self.connection_info = self._km.get_connection_info()
        self.session = self._km.session

    @property
    def pid(self) -> int | None:
        provisioner = getattr(self._km, "provisioner", None)
        return getattr(provisioner, "pid", None)

    def _returncode(self) -> int | None:
        process = getattr(getattr(self._km, "provisioner", None), "process", None)
        return process.poll() if process is not None else None

    def watch(self, on_exit: ExitCallback) -> None:
        pid = self.pid
        if pid is None:
            return
        loop = asyncio.get_running_loop()

        def exited() -> None:
            self._close_pidfd()
            on_exit(self._returncode())

        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfd: fall back to a waiting thread
            process = getattr(self._km.provisioner, "process", None)
            if process is None:
                return
            task = asyncio.ensure_future(asyncio.to_thread(process.wait))
            task.add_done_callback(lambda _: exited())
            return
        loop.add_reader(self._pidfd, exited)

    def _close_pidfd(self) -> None:
        fd, self._pidfd = self._pidfd, None
        unwatch_and_close(fd)

    async def interrupt(self) -> None:
        await self._km.interrupt_kernel()

    async def stop(self, *, now: bool, grace: float, ask: ShutdownRequest | None) -> None:
        started = time.monotonic()
        with contextlib.suppress(Exception):  # already dead or never started
            await asyncio.wait_for(self._km.shutdown_kernel(now=now), grace + 1)
        if time.monotonic() - started > grace:
            with contextlib.suppress(Exception):
                await self._km.shutdown_kernel(now=True)
        self._close_pidfd()
