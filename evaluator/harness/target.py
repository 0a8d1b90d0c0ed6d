"""What every load target returns, so the service can wrap any of them in the same record."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from evaluator.harness.arrivals import Arrival
from evaluator.harness.manifests import LoadManifest

__all__ = ["LoadTarget", "Progress", "TargetRun", "window"]

# Called with the fraction of the virtual window covered so far, from 0.0 to 1.0.
Progress = Callable[[float], None]


@dataclass(frozen=True, slots=True)
class TargetRun:
    """The outcome of driving one target over one window of the timeline."""

    mode: str
    window: Mapping[str, Any]
    observations: Mapping[str, Any]
    virtual_duration_ms: float
    # The bounded series for the run page's charts; kept beside the record, never in it.
    timeline: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LoadTarget:
    """A path through the system that a manifest's arrivals can be released into.

    ``window_end_ms`` says how much of the timeline the path takes; ``run`` releases those
    arrivals on virtual time and reports what it observed. ``make_arrivals`` makes them when
    the path does not take them from the manifest's own arrival model.
    """

    name: str
    window_end_ms: Callable[[LoadManifest], float]
    run: Callable[[LoadManifest, Iterable[Arrival], Progress | None], TargetRun]
    make_arrivals: Callable[[LoadManifest, float], list[Arrival]] | None = None


def window(end_ms: float) -> dict[str, Any]:
    """The ``window`` object of a record: virtual time from 0 to ``end_ms``."""
    seconds = end_ms / 1000.0
    return {
        "startMs": 0,
        "endMs": int(end_ms) if float(end_ms).is_integer() else end_ms,
        "seconds": int(seconds) if seconds.is_integer() else seconds,
    }
