"""Releasing a timeline of arrivals on virtual time: what every load path shares."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Iterator

from admission.core import AdmissionRegistry, Profile, VirtualTimeLoop
from evaluator.harness.arrivals import Arrival
from evaluator.harness.manifests import LoadManifest
from evaluator.harness.records import MODE_OFFLINE
from evaluator.harness.tally import LoadTally
from evaluator.harness.target import Progress, TargetRun, window
from evaluator.harness.timeline import TimelineSampler

__all__ = ["WORKSPACE_ID", "TimelineDriver"]

WORKSPACE_ID = "load-harness"


class TimelineDriver:
    """Releases arrivals at their instants on a fresh virtual-time loop and waits until all end.

    A subclass says what an arrival does (`_arrive`) and when it has nothing open
    (`_idle`); this class owns the loop, the registry built from the manifest's profile, the
    timeline cursor, progress reports, and stopping on the first harness error. A path that
    runs at real time replaces ``_new_loop`` and ``mode``.
    """

    mode = MODE_OFFLINE

    def __init__(
        self,
        manifest: LoadManifest,
        arrivals: Iterable[Arrival],
        end_ms: float,
        progress: Progress | None = None,
    ) -> None:
        model = manifest.section("arrivalModel")
        self.manifest = manifest
        self.end_ms = end_ms
        self.progress = progress
        self.max_retries = int(model.get("maxRetries", 0))
        self.backoff_ms = float(model.get("retryBackoffMs", 0))
        self.tally = LoadTally()
        self.timeline = TimelineSampler(self.tally, end_ms)
        self.loop = self._new_loop()
        self.clock = self.loop.clock
        self.registry = AdmissionRegistry(clock=self.clock, rng=random.Random(model["seed"]))
        self.controller = self.registry.register(
            Profile.from_manifest(manifest.document, workspace_id=WORKSPACE_ID)
        )
        self._timeline = arrivals
        self._arrivals: Iterator[Arrival] = iter(())
        self._pending: Arrival | None = None
        self._drained: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    def _new_loop(self) -> VirtualTimeLoop:
        """The loop the timeline runs on; its ``clock`` is the registry's clock."""
        return VirtualTimeLoop()

    def run(self) -> TargetRun:
        """Run the window; returns when the last arrival has ended."""
        loop = self.loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()
        if self._error is not None:
            raise self._error
        duration_ms = self.clock.monotonic_ms()
        self.timeline.sample(duration_ms)
        return TargetRun(
            mode=self.mode,
            window=window(self.end_ms),
            observations=self.tally.observations(duration_ms),
            virtual_duration_ms=duration_ms,
            timeline=self.timeline.to_dict(),
        )

    def _arrive(self, arrival: Arrival) -> None:
        raise NotImplementedError

    def _idle(self) -> bool:
        raise NotImplementedError

    async def _main(self) -> None:
        loop = self.loop
        self._drained = loop.create_future()
        self._arrivals = iter(self._timeline)
        self._pending = next(self._arrivals, None)
        if self._pending is not None:
            loop.call_at(self._pending.at_ms / 1000.0, self._release_due)
        else:
            self._drained.set_result(None)
        if self.progress is not None:
            self._report_progress()
        loop.call_later(self.timeline.step_ms / 1000.0, self._sample)
        await self._drained
        if self.progress is not None:
            self.progress(1.0)

    def _report_progress(self) -> None:
        assert self.progress is not None
        try:
            self.progress(min(self.clock.monotonic_ms() / self.end_ms, 1.0))
        except Exception as error:
            # The host stops the run from its progress callback (a cancel, a lost claim).
            self._fail(error)
            return
        if self._pending is not None:
            self.loop.call_later(self.end_ms / 100_000.0, self._report_progress)

    def _sample(self) -> None:
        drained = self._drained
        if drained is not None and drained.done():
            return
        now_ms = self.clock.monotonic_ms()
        self.timeline.sample(now_ms)
        if self.timeline.sampling(now_ms):
            self.loop.call_later(self.timeline.step_ms / 1000.0, self._sample)

    def _release_due(self) -> None:
        # Arrivals of the same millisecond start together, in timeline order.
        arrival = self._pending
        while arrival is not None:
            self._arrive(arrival)
            following = next(self._arrivals, None)
            if following is not None and following.at_ms == arrival.at_ms:
                arrival = following
                continue
            self._pending = following
            if following is not None:
                self.loop.call_at(following.at_ms / 1000.0, self._release_due)
            break
        self._check_drained()

    def _check_drained(self) -> None:
        drained = self._drained
        if drained is None or drained.done():
            return
        if self._error is not None or (self._pending is None and self._idle()):
            drained.set_result(None)

    def _fail(self, error: BaseException) -> None:
        # A harness or controller bug: stop the run and re-raise it from run().
        if self._error is None:
            self._error = error
        self._check_drained()
