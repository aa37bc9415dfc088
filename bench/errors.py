"""The benchmark's one exception, and the record of a failure it reports instead of hiding."""

from __future__ import annotations

from dataclasses import asdict, dataclass


class BenchError(Exception):
    """A measurement could not be taken (a target failed, or did not answer in time)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """What was asked and what came back, for the report (never worked around)."""

    level: str  # "pool" or "worker"
    target: str
    case: str
    request: str
    status: int | None
    response: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)
