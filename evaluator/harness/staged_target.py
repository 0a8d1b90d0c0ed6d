"""The staged-provider path (gate G5): the manifest's arrivals at real time against a real
OpenAI-compatible endpoint, through the real evaluator and admission controller.

It is the evaluator path with two things swapped: the loop runs at real time (counted from the
start of the run, so the timeline's instants are the loop's own), and each manifest provider
lane calls a configured endpoint instead of a fake adapter. The endpoint answers for itself:
its latency is the service time, its errors (429, 5xx) are the failures and retries, and the
arrivals' scripted service times and first-attempt failures are not used.

Two bounds keep a staged run safe to point at a shared provider:

* **duration**: only the first ``window_seconds`` of the manifest's timeline run (at most
  ``STAGED_MAX_WINDOW_SECONDS``), then the run waits for the calls in flight; a test uses a
  window of a couple of seconds;
* **capacity**: every endpoint documents its capacity (``concurrency`` and optionally
  ``requestsPerMinute``), and the run is refused unless the manifest profile's ceilings for the
  lanes sent to that endpoint (the smaller of the workspace ceiling and the sum of the lanes'
  provider ceilings) stay at or below it. The admission controller then keeps every call of
  the run inside those ceilings.

The record has mode and target ``staged-provider`` and is bound to the manifest; only such a
verified, passing record sets ``load-manifest-qualified``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from admission.core import Profile
from evaluator.harness.arrivals import Arrival
from evaluator.harness.controller_target import schedule_end_ms
from evaluator.harness.errors import LoadHarnessError
from evaluator.harness.evaluator_target import EvaluatorDriver
from evaluator.harness.manifests import LoadManifest
from evaluator.harness.observed import ObservedAdapter
from evaluator.harness.records import MODE_STAGED, TARGET_STAGED
from evaluator.harness.replay import WORKSPACE_ID
from evaluator.harness.service import run_target
from evaluator.harness.target import LoadTarget, Progress, TargetRun

__all__ = [
    "STAGED_MAX_WINDOW_SECONDS",
    "Capacity",
    "StagedConfigError",
    "StagedEndpoint",
    "check_capacity",
    "run_staged",
    "staged_window_ms",
]

# The longest staged run the harness starts: five minutes of the manifest's timeline.
STAGED_MAX_WINDOW_SECONDS = 300


class StagedConfigError(LoadHarnessError):
    """A staged run that must not start; ``field`` names the setting at fault."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a provider endpoint's operator documents it can take."""

    concurrency: int
    requests_per_minute: float | None = None


@dataclass(frozen=True, slots=True)
class StagedEndpoint:
    """Where one manifest provider lane sends its calls: an adapter, its model and capacity."""

    adapter_id: str
    adapter: Any
    model: str
    capacity: Capacity | None


def staged_window_ms(manifest: LoadManifest, window_seconds: float) -> float:
    """The part of the timeline a staged run releases, or ``StagedConfigError``."""
    if (
        isinstance(window_seconds, bool)
        or not isinstance(window_seconds, int | float)
        or not 0 < window_seconds <= STAGED_MAX_WINDOW_SECONDS
    ):
        raise StagedConfigError(
            f"windowSeconds must be a number of seconds in (0, {STAGED_MAX_WINDOW_SECONDS}], "
            f"got {window_seconds!r}",
            field="windowSeconds",
        )
    return min(float(window_seconds) * 1000.0, schedule_end_ms(manifest))


def _ceiling(workspace: float | None, lanes: list[float | None]) -> float | None:
    # None is unlimited: a lane without the limit makes the sum unlimited too.
    lane_sum = None if any(value is None for value in lanes) else sum(v or 0 for v in lanes)
    candidates = [value for value in (workspace, lane_sum) if value is not None]
    return min(candidates) if candidates else None


def check_capacity(manifest: LoadManifest, endpoints: Mapping[str, StagedEndpoint]) -> None:
    """Refuse a staged run whose profile ceilings could exceed an endpoint's documented capacity.

    Every manifest provider needs an endpoint, and every endpoint a documented capacity.
    """
    profile = Profile.from_manifest(manifest.document, workspace_id=WORKSPACE_ID)
    missing = sorted(set(profile.providers) - set(endpoints))
    if missing:
        raise StagedConfigError(
            f"no endpoint for the manifest's provider {missing[0]!r}", field="adapter"
        )
    lanes_by_adapter: dict[str, list[str]] = {}
    for provider_id in sorted(profile.providers):
        lanes_by_adapter.setdefault(endpoints[provider_id].adapter_id, []).append(provider_id)
    for adapter_id, lanes in lanes_by_adapter.items():
        capacity = endpoints[lanes[0]].capacity
        if capacity is None:
            raise StagedConfigError(
                f"adapter {adapter_id!r} documents no capacity; a staged run stays below it",
                field=f"{adapter_id}.capacity",
            )
        limits = [profile.providers[lane] for lane in lanes]
        concurrency = _ceiling(profile.workspace.concurrency, [x.concurrency for x in limits])
        assert concurrency is not None
        if concurrency > capacity.concurrency:
            raise StagedConfigError(
                f"the manifest lets {concurrency:g} calls run at once on {', '.join(lanes)}, "
                f"above the documented capacity of {adapter_id!r} ({capacity.concurrency})",
                field=f"{adapter_id}.capacity.concurrency",
            )
        if capacity.requests_per_minute is not None:
            rate = _ceiling(
                profile.workspace.requests_per_minute, [x.requests_per_minute for x in limits]
            )
            if rate is None or rate > capacity.requests_per_minute:
                shown = "no limit" if rate is None else f"{rate:g} requests per minute"
                raise StagedConfigError(
                    f"the manifest allows {shown} on {', '.join(lanes)}, above the documented "
                    f"capacity of {adapter_id!r} ({capacity.requests_per_minute:g})",
                    field=f"{adapter_id}.capacity.requestsPerMinute",
                )


class _RealTimeClock:
    """Milliseconds since the loop started, and the wall clock for timestamps."""

    __slots__ = ("_loop",)

    def __init__(self, loop: _RealTimeLoop) -> None:
        self._loop = loop

    def monotonic_ms(self) -> float:
        return self._loop.time() * 1000.0

    def epoch_ms(self) -> float:
        return time.time() * 1000.0


class _RealTimeLoop(asyncio.SelectorEventLoop):
    """A real event loop whose time starts at zero, like the virtual loop's."""

    def __init__(self) -> None:
        super().__init__()
        self._origin = time.monotonic()
        self.clock = _RealTimeClock(self)

    def time(self) -> float:
        return time.monotonic() - self._origin


class StagedDriver(EvaluatorDriver):
    """The evaluator path at real time, each provider lane calling its configured endpoint."""

    mode = MODE_STAGED

    def __init__(
        self,
        manifest: LoadManifest,
        arrivals: Iterable[Arrival],
        end_ms: float,
        endpoints: Mapping[str, StagedEndpoint],
        progress: Progress | None = None,
    ) -> None:
        super().__init__(manifest, arrivals, end_ms, progress)
        self._endpoints = endpoints
        self.adapters = {
            provider_id: ObservedAdapter(endpoints[provider_id].adapter, self.tally)
            for provider_id in manifest.section("providers")
        }

    def _new_loop(self) -> Any:
        return _RealTimeLoop()

    def _model(self, provider_id: str) -> str:
        return self._endpoints[provider_id].model

    async def _main(self) -> None:
        try:
            await super()._main()
        finally:
            closed: set[int] = set()
            for endpoint in self._endpoints.values():
                close = getattr(endpoint.adapter, "aclose", None)
                if close is not None and id(endpoint.adapter) not in closed:
                    closed.add(id(endpoint.adapter))
                    await close()


def run_staged(
    manifest: LoadManifest,
    endpoints: Mapping[str, StagedEndpoint],
    window_seconds: float,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the first ``window_seconds`` of ``manifest`` at real time against ``endpoints``
    (manifest provider id → endpoint) and return the ``staged-provider`` record.

    Raises ``StagedConfigError`` before anything is sent when the window or a capacity is out
    of bounds.
    """
    end_ms = staged_window_ms(manifest, window_seconds)
    check_capacity(manifest, endpoints)

    def drive(
        manifest: LoadManifest, arrivals: Iterable[Arrival], tick: Progress | None
    ) -> TargetRun:
        return StagedDriver(manifest, arrivals, end_ms, endpoints, tick).run()

    runner = LoadTarget(name=TARGET_STAGED, window_end_ms=lambda _m: end_ms, run=drive)
    return run_target(manifest, runner, progress)
