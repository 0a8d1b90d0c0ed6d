"""Two sides of a rollout compared bound by bound (active against shadow, current against
canary): plain tallies in, verdicts out; no database, no framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bound", "Comparison", "compare_tallies", "rejected_count"]


@dataclass(frozen=True, slots=True)
class Bound:
    """One bound compared: its value on both sides and a plain verdict."""

    key: str
    title: str
    active: float
    shadow: float
    passed: bool
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "bound": self.key,
            "title": self.title,
            "active": self.active,
            "shadow": self.shadow,
            "pass": self.passed,
            "verdict": self.verdict,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """Active against shadow (or current against canary) over one window."""

    active: dict[str, Any]
    shadow: dict[str, Any]
    bounds: list[Bound]
    observations: int
    # After each observation: (requests or runs so far, rejected so far on each side), plotted.
    series: list[tuple[int, int, int]] = field(default_factory=list)
    series_unit: str = "requests"

    @property
    def passed(self) -> bool:
        """Whether the other side was no worse on every bound; false until something was seen."""
        return self.observations > 0 and all(bound.passed for bound in self.bounds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "observations": self.observations,
            "active": self.active,
            "shadow": self.shadow,
            "bounds": [bound.to_dict() for bound in self.bounds],
            "passed": self.passed,
        }


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def rejected_count(tally: Mapping[str, Any]) -> int:
    return sum(int(count) for count in tally.get("rejected", {}).values())


def _amplification(tally: Mapping[str, Any]) -> float:
    first = int(tally.get("requests", 0)) - int(tally.get("retries", 0))
    extra = int(tally.get("wouldRetry", 0))
    return (int(tally.get("requests", 0)) + extra) / first if first > 0 else 1.0


def _opened(tally: Mapping[str, Any]) -> int:
    return sum(
        int(n) for key, n in tally.get("breakerTransitions", {}).items() if key.endswith(">open")
    )


def compare_tallies(
    active: Mapping[str, Any],
    shadow: Mapping[str, Any],
    *,
    other: str = "shadow",
    base: str = "active",
) -> list[Bound]:
    """A verdict per bound: the `other` side passes a bound when it is no worse than `base`."""

    def bound(key: str, title: str, a: float, s: float, unit: str, show: str = "{:g}") -> Bound:
        passed = s <= a + 1e-9
        if abs(s - a) <= 1e-9:
            verdict = f"same as {base} ({show.format(s)}{unit})"
        elif s < a:
            verdict = f"better: {show.format(s)}{unit} against {show.format(a)}{unit}"
        else:
            verdict = f"worse: {show.format(s)}{unit} against {show.format(a)}{unit}"
        return Bound(key, title, a, s, passed, verdict)

    rejected_a, rejected_s = rejected_count(active), rejected_count(shadow)
    bounds = [
        bound(
            "rejectedShare",
            "Requests rejected",
            _share(rejected_a, active.get("requests", 0)),
            _share(rejected_s, shadow.get("requests", 0)),
            "",
            "{:.1%}",
        ),
        bound(
            "deferredShare",
            "Requests that waited in a queue",
            _share(active.get("deferred", 0), active.get("requests", 0)),
            _share(shadow.get("deferred", 0), shadow.get("requests", 0)),
            "",
            "{:.1%}",
        ),
        bound(
            "maxQueued",
            "Deepest queue (waiting requests)",
            active.get("maxQueued", 0),
            shadow.get("maxQueued", 0),
            "",
        ),
        bound(
            "maxQueueDelayMs",
            "Longest queue delay",
            active.get("queueDelayMs", {}).get("max", 0.0),
            shadow.get("queueDelayMs", {}).get("max", 0.0),
            " ms",
            "{:.0f}",
        ),
        bound(
            "retryAmplification",
            "Retry amplification (attempts per first attempt)",
            _amplification(active),
            _amplification(shadow),
            "",
            "{:.2f}",
        ),
        bound(
            "breakerOpened",
            "Breaker openings",
            _opened(active),
            _opened(shadow),
            "",
        ),
    ]
    if rejected_s > rejected_a:
        reasons = ", ".join(f"{k} {v}" for k, v in shadow.get("rejected", {}).items())
        first = bounds[0]
        bounds[0] = Bound(
            first.key,
            first.title,
            first.active,
            first.shadow,
            first.passed,
            f"{first.verdict} ({rejected_s - rejected_a} more; {other}: {reasons})",
        )
    return bounds
