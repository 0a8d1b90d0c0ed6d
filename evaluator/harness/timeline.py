"""A bounded time series of a load run, for the run page's charts; never part of the record.

Every ``step_ms`` of virtual time the sampler notes the highest active and queued counts since
the previous sample (the tally keeps those peaks at every transition, so no spike falls between
samples) and the running totals of arrivals, admissions and sheds. When the series would grow
past ``max_samples`` neighbouring samples are merged and the step doubles, so a long tail costs
no more memory than the window did.
"""

from __future__ import annotations

from typing import Any

from evaluator.harness.tally import LoadTally

__all__ = ["TIMELINE_SCHEMA", "TimelineSampler"]

TIMELINE_SCHEMA = "sluice-load-timeline/v1"
STEPS_PER_WINDOW = 200
MAX_SAMPLES = 400
# Sampling stops here even if the run has not drained, so a stuck run still ends in the virtual
# loop's deadlock error instead of sampling forever; the final sample is taken at the end anyway.
SAMPLING_HORIZON = 3.0


class TimelineSampler:
    """Samples ``tally`` at fixed virtual-time steps over a window that ends at ``end_ms``."""

    __slots__ = ("_samples", "end_ms", "max_samples", "step_ms", "tally")

    def __init__(
        self,
        tally: LoadTally,
        end_ms: float,
        *,
        steps: int = STEPS_PER_WINDOW,
        max_samples: int = MAX_SAMPLES,
    ) -> None:
        self.tally = tally
        self.end_ms = end_ms
        self.step_ms = max(end_ms / steps, 1.0)
        self.max_samples = max(2, max_samples)
        self._samples: list[tuple[Any, ...]] = [(0.0, 0, 0, 0, {}, {}, {})]

    def sampling(self, now_ms: float) -> bool:
        """Whether another sample should be scheduled after ``now_ms``."""
        return now_ms < self.end_ms * SAMPLING_HORIZON

    def sample(self, now_ms: float) -> None:
        """Record the step that ends at ``now_ms`` and start the next one."""
        tally = self.tally
        self._samples.append(
            (
                now_ms,
                tally.peak_active,
                tally.peak_queued,
                tally.shed,
                dict(tally.arrivals_by_class),
                dict(tally.admitted_by_class),
                dict(tally.shed_reasons),
            )
        )
        tally.peak_active = tally.active
        tally.peak_queued = tally.queued
        if len(self._samples) > self.max_samples:
            self._halve()

    def _halve(self) -> None:
        # Keep the first point (time 0); merge each later pair into its second half.
        first, rest = self._samples[0], self._samples[1:]
        merged = [first]
        for index in range(0, len(rest) - 1, 2):
            a, b = rest[index], rest[index + 1]
            merged.append((b[0], max(a[1], b[1]), max(a[2], b[2]), *b[3:]))
        if len(rest) % 2:
            merged.append(rest[-1])
        self._samples = merged
        self.step_ms *= 2

    def to_dict(self) -> dict[str, Any]:
        """The series as columns: one list per quantity, aligned with ``atMs``."""
        samples = self._samples
        classes = sorted({name for sample in samples for name in sample[4]})
        reasons = sorted({name for sample in samples for name in sample[6]})

        def ratio(sample: tuple[Any, ...], name: str) -> float | None:
            arrivals = sample[4].get(name, 0)
            return round(sample[5].get(name, 0) / arrivals, 6) if arrivals else None

        return {
            "schema": TIMELINE_SCHEMA,
            "stepMs": _whole(self.step_ms),
            "windowEndMs": _whole(self.end_ms),
            "atMs": [_whole(sample[0]) for sample in samples],
            "activePeak": [sample[1] for sample in samples],
            "queuedPeak": [sample[2] for sample in samples],
            "shed": [sample[3] for sample in samples],
            "admissionRatio": {name: [ratio(s, name) for s in samples] for name in classes},
            "shedByReason": {name: [s[6].get(name, 0) for s in samples] for name in reasons},
        }


def _whole(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 3)
