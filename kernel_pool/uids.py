"""Which uid of ``PoolConfig.kernel_uids`` a pool's next kernel runs as.

A uid goes to one kernel at a time, over every pool sharing the range: it is held by a
kernel of this pool (a retired one's until it is torn down: its processes killed, what its
uid left removed), by a kernel of another pool (``uids_elsewhere``), or by any process still
running as it. A pool whose range is all held, one uid by a kernel being torn down, waits
for that teardown instead of failing a start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .errors import KernelStartError
from .kernel import Kernel
from .processes import processes_of_uid

UidsHeld = Callable[[], set[int]]


def uids_of(kernels: Iterable[Kernel]) -> set[int]:
    """The uids these kernels run as alone (``kernel_uids``)."""
    return {uid for k in kernels if (uid := k.own_uid) is not None}


class KernelUids:
    """The range of ``kernel_uids`` as one pool sees it (``None``: kernels have no uid of
    their own, and every question here has its trivial answer)."""

    def __init__(
        self, uids: tuple[int, int] | None, held: UidsHeld, elsewhere: UidsHeld | None
    ) -> None:
        """``held``: the uids the pool's kernels hold; ``elsewhere``: those other pools'
        kernels hold."""
        self._range = uids
        self._held = held
        self._elsewhere = elsewhere

    def _taken(self) -> set[int]:
        taken = self._held()
        if self._elsewhere is not None:
            taken |= self._elsewhere()
        return taken

    def free(self) -> int | None:
        """The first uid of the range that no kernel holds and no process runs as.
        :class:`KernelStartError` when every uid is still taken."""
        if self._range is None:
            return None
        first, last = self._range
        taken = self._taken()
        for uid in range(first, last + 1):
            if uid not in taken and not processes_of_uid(uid):
                return uid
        raise KernelStartError(f"every kernel uid of {first}-{last} is still in use")

    def all_held(self) -> bool:
        """Every uid of the range is held by a kernel (of this pool or another)."""
        if self._range is None:
            return False
        first, last = self._range
        taken = self._taken()
        return all(uid in taken for uid in range(first, last + 1))
