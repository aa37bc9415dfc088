"""The warm baseline as the in-kernel modules share it: what :func:`~.reset.capture`
recorded, the names the preload made, the shell, and cheap snapshots of dicts.

Every reset returns the kernel to this record; each module reads the parts it restores.
"""

from __future__ import annotations

import itertools
from typing import Any

MISSING = object()
BASELINE: dict[str, Any] = {}
"""What the kernel held at the baseline, by part (filled by ``capture``)."""
PRELOADED: set[str] = set()
"""Names the preload bound (a cell that deletes or replaces one is reported)."""


def get_shell() -> Any:
    """The kernel's IPython shell."""
    from IPython import get_ipython

    return get_ipython()


class Snapshot:
    """A dict's keys and values at baseline, to tell cheaply (in C) whether it still holds
    exactly them: the same objects, not merely equal ones, which a cell's object could be.

    C compares the whole list of values at once with ``==``, which checks identity first and
    then equality. Where equality is identity (functions, classes, modules) or equal values
    are interchangeable (strings, numbers, bytes), that is the same answer; the few values
    whose equality means something else (a mapping such as ``os.environ``: a cell could put
    an equal dict in its place) are also checked one by one, by identity.
    """

    __slots__ = ("by_identity", "items", "keys", "values")

    def __init__(self, mapping: Any) -> None:
        self.items = dict(mapping)
        self.keys = list(self.items)
        self.values = list(self.items.values())
        self.by_identity = [(k, v) for k, v in self.items.items() if not _equal_is_same(v)]

    def unchanged(self, current: Any, *, exact: bool) -> Any:
        """``current`` starts with the baseline entries, same objects, in the same order
        (``exact``: and has nothing else)."""
        count = len(self.keys)
        if len(current) < count or (exact and len(current) != count):
            return False
        prefix = itertools.islice
        return (
            list(prefix(current.values(), count)) == self.values
            and list(prefix(current, count)) == self.keys
            and all(current.get(key) is value for key, value in self.by_identity)
        )

    def restore(self, current: Any, *, exact: bool) -> None:
        """Put the baseline entries back into ``current`` (``exact``: and drop the rest)."""
        if self.unchanged(current, exact=exact):
            return
        for key, value in self.items.items():
            if current.get(key, MISSING) is not value:
                current[key] = value
        if exact:
            for key in [k for k in list(current) if k not in self.items]:
                del current[key]


# equal ones are interchangeable; builtin functions are equal when they are the same C
# function bound to the same object
_INTERCHANGEABLE: tuple[type, ...] = (
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    type(None),
    type(Ellipsis),
    type(len),
    type([].append),
)


def _equal_is_same(value: Any) -> Any:
    """Whether ``== value`` can only be true of ``value`` or of an interchangeable twin."""
    kind = type(value)
    equal: object = kind.__eq__
    return kind in _INTERCHANGEABLE or equal is object.__eq__
