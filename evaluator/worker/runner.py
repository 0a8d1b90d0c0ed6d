"""The evaluation runner of a worker process: claims runs from the database, runs many at once.

One worker process hosts one runner: a dispatcher thread and the process's event loop
(`evaluator.worker.loop`), on which every evaluation of the process runs, with the process's
admission registry. The dispatcher

- claims queued runs from the database while the process has free slots
  (`SLUICE_WORKER_SLOTS`, default 64), fairly across workspaces (`evaluator.worker.dispatch`), and
  starts each as a task on the loop. A run that waits for admission is a suspended coroutine
  there: it holds no thread, no Celery slot and no runner slot (a process holds at most
  `_WAITING_FACTOR` times its slots in runs, waiting ones included);
- wakes at once when a doorbell arrives (the Celery task `evaluator.run_evaluation`, which the
  web server publishes when a run is committed) or a run of its own ends, and otherwise every
  `SLUICE_DISPATCH_POLL_SECONDS` (2 s): a run whose doorbell was lost (a broker restart, a web
  server killed between commit and publish) is claimed at the next poll all the same;
- claims queued load runs the same way (`evaluator.worker.load_dispatch`), up to
  `SLUICE_WORKER_LOAD_SLOTS` (2) at once, each run by a thread of its own;
- writes heartbeats for its runs every `SLUICE_RUN_HEARTBEAT_SECONDS` (5 s), and sweeps: a
  `running` run whose claimant stopped heartbeating for `SLUICE_RUN_STALE_SECONDS` (30 s), or
  whose claimant process on this host is gone, goes back to the backlog and is claimed again,
  resuming from its receipt (a call that may have gone out is never sent again).

The database being unreachable stops nothing for good: the dispatcher retries every poll, a
run whose receipt cannot be written is given back to the backlog once the database answers
again, and a finished run's result is written as soon as it can be. Nothing gives up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

from django.conf import settings
from django.db import DatabaseError, InterfaceError, close_old_connections, connections

from admission.core import AdmissionRegistry
from admission.runtime import live, refresh
from admission.runtime import registry as runtime
from evaluator.engine import holds
from evaluator.engine.errors import InvalidDefinitionError, ReceiptConflictError
from evaluator.models import EvaluationRun, LoadRun
from evaluator.services import runs as services
from evaluator.services import server_clock
from evaluator.services.load_runs import load_run_execute_claimed, load_run_give_back
from evaluator.worker import dispatch, execute, load_dispatch
from evaluator.worker.loop import evaluation_loop
from evaluator.worker.receipts_db import DatabaseReceiptStore, in_database_thread

__all__ = ["Runner", "current_runner", "start_runner", "stop_runner"]

logger = logging.getLogger(__name__)

# Runs waiting for admission hold no slot; all runs of a process, waiting or not, stay below
# this many times its slots.
_WAITING_FACTOR = 4
# What a database that is not reachable raises (a closed connection may raise InterfaceError,
# which Django does not count as a DatabaseError).
_DATABASE_DOWN = (DatabaseError, InterfaceError)
# Waits between attempts to write to a database that does not answer.
_RETRY_FIRST_SECONDS = 0.5
_RETRY_MAX_SECONDS = 5.0


@dataclass
class _Held:
    token: uuid.UUID
    future: concurrent.futures.Future[None] | None = None
    lost: bool = False


@dataclass
class _LoadHeld:
    run: LoadRun
    token: uuid.UUID
    future: concurrent.futures.Future[None] | None = None


@dataclass
class _Counters:
    claimed: int = 0
    finished: int = 0
    given_back: int = 0
    swept: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class Runner:
    """Claims runs for this process and runs them on its event loop (see the module doc)."""

    def __init__(self, *, slots: int | None = None) -> None:
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.slots = int(slots or settings.SLUICE_WORKER_SLOTS)
        self.loop = evaluation_loop()
        # Receipts and results of this process's evaluations are written from these threads.
        self.database = ThreadPoolExecutor(
            max_workers=int(settings.SLUICE_WORKER_DB_THREADS), thread_name_prefix="sluice-db"
        )
        # Slot writes go from the loop on connections of its own (as many as the pool's threads).
        self.receipts = DatabaseReceiptStore(
            self.database, direct_slots=int(settings.SLUICE_WORKER_DB_THREADS)
        )
        self.counters = _Counters()
        self._held: dict[uuid.UUID, _Held] = {}
        # Load runs: each runs the harness in a thread of its own, at most `load_slots` at once.
        self.load_slots = int(settings.SLUICE_WORKER_LOAD_SLOTS)
        self._load_pool = ThreadPoolExecutor(
            max_workers=self.load_slots, thread_name_prefix="sluice-load"
        )
        self._load_held: dict[uuid.UUID, _LoadHeld] = {}
        self._load_stop = threading.Event()
        self._waiting = 0  # runs of this process waiting for admission, none of their calls out
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._claiming = True
        self._trust = dispatch.HeartbeatTrust.from_settings()
        self._next_beat = 0.0
        self._next_sweep = 0.0
        self._down_logged = False
        self._thread = threading.Thread(target=self._serve, name="sluice-dispatcher", daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Register this worker (raises `dispatch.WorkerRefused`) and start dispatching."""
        coordinated = bool(settings.SLUICE_ADMISSION_REDIS_URL)
        dispatch.worker_register(self.worker_id, coordinated=coordinated, slots=self.slots)
        with self.loop.frozen():
            runtime.get_registry()
        refresh.start_listener(self.loop.frozen)
        if not coordinated:
            # No shared state to read: publish this process's figures for operators' views.
            live.start_publisher(self.worker_id, self.loop.loop)
        # The first slot writes find their connections open (an opening costs milliseconds).
        asyncio.run_coroutine_threadsafe(self.receipts.warm(), self.loop.loop)
        self._thread.start()
        logger.info(
            "evaluation runner %s: %d slots, admission %s",
            self.worker_id,
            self.slots,
            "shared through Redis" if coordinated else "in this process only",
        )

    def load_in_flight(self) -> int:
        with self._lock:
            return len(self._load_held)

    def _stop_load_runs(self) -> None:
        """Stop the load runs still running: each gives itself back at its next progress report
        (a staged-provider run ends `interrupted`); what does not stop in time is given back
        from here."""
        self._load_stop.set()
        with self._lock:
            futures = [held.future for held in self._load_held.values() if held.future]
        concurrent.futures.wait(futures, timeout=5)
        with self._lock:
            left = list(self._load_held.values())
        for held in left:
            with contextlib.suppress(DatabaseError):
                load_run_give_back(held.run, held.token, "its worker stopped")
        self._load_pool.shutdown(wait=False)

    def wake(self) -> None:
        """Look at the backlog now (a doorbell rang, or a slot came free)."""
        self._wake.set()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._held)

    def busy(self) -> int:
        """Runs holding a slot: those in flight, less those waiting for admission."""
        with self._lock:
            return len(self._held) - self._waiting

    def admission_wait(self, change: int) -> None:
        """One more (+1) or one fewer (-1) of this runner's runs waits for admission."""
        with self._lock:
            was_full = len(self._held) - self._waiting >= self.slots
            self._waiting += change
        if change > 0 and was_full:
            self._wake.set()

    def stop(self, drain_seconds: float | None = None) -> None:
        """Stop claiming, let running evaluations finish for up to `drain_seconds`, then give
        the rest back to the backlog (the next claimant resumes them from their receipts)."""
        self._claiming = False
        drain = float(
            settings.SLUICE_WORKER_DRAIN_SECONDS if drain_seconds is None else drain_seconds
        )
        deadline = time.monotonic() + drain
        while (self.in_flight() or self.load_in_flight()) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._halt.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._stop_load_runs()
        with self._lock:
            left = {run_id: held.token for run_id, held in self._held.items()}
        try:
            for run_id, token in left.items():
                if dispatch.run_release(run_id, token):
                    logger.warning("evaluation %s given back to the backlog at shutdown", run_id)
            dispatch.worker_stopped(self.worker_id)
        except DatabaseError as error:
            # The sweeper of the next worker takes them back once this one's heartbeat is old.
            logger.warning("could not give runs back at shutdown: %s", type(error).__name__)
        finally:
            self._abort_left()
            self._keep_held_permits()
            refresh.stop_listener()
            live.stop_publisher()
            self._close_slot_connections()
            self.database.shutdown(wait=False)
            connections.close_all()

    def _close_slot_connections(self) -> None:
        """Close the loop's slot connections (the loop may be gone already, and they with it)."""
        try:
            closing = asyncio.run_coroutine_threadsafe(self.receipts.aclose(), self.loop.loop)
            closing.result(timeout=5)
        except (RuntimeError, TimeoutError, concurrent.futures.TimeoutError, *_DATABASE_DOWN):
            logger.info("evaluation runner: slot connections left to close with the process")

    def _abort_left(self) -> None:
        """Stop the evaluations given back at shutdown: their calls in flight are aborted, and
        the permit of each call that may have reached the provider is held
        (evaluator/engine/holds.py)."""
        with self._lock:
            futures = [held.future for held in self._held.values() if held.future is not None]
        for future in futures:
            future.cancel()
        concurrent.futures.wait(futures, timeout=5)

    def _keep_held_permits(self) -> None:
        """Live on while permits of aborted calls must still be held.

        A permit held in this process dies with it. With admission in Redis, the permits of a
        process that stops renewing stay taken for a lease TTL after its last renewal, so the
        process waits only for what outlasts that; in-process admission waits for all of it.
        """
        try:
            left = self.loop.run(_hold_left_seconds())
        except RuntimeError:
            return  # the loop is gone already, and its permits with it
        if settings.SLUICE_ADMISSION_REDIS_URL:
            covered = (
                settings.SLUICE_ADMISSION_LEASE_TTL_MS - settings.SLUICE_ADMISSION_HEARTBEAT_MS
            ) / 1000.0
            left -= max(0.0, covered)
        if left > 0:
            logger.warning(
                "waiting %.1f s before stopping: aborted calls may still run at the provider and "
                "their permits stay held until their timeouts",
                left,
            )
            time.sleep(left)

    # ----------------------------------------------------------------- dispatcher

    def _serve(self) -> None:
        poll = float(settings.SLUICE_DISPATCH_POLL_SECONDS)
        while not self._halt.is_set():
            wait = poll
            try:
                self._tick()
                # Beats keep their interval whatever the poll (HeartbeatTrust counts on it).
                wait = max(0.0, min(poll, self._next_beat - time.monotonic()))
            except _DATABASE_DOWN as error:
                self._database_down(error)
            except Exception:
                logger.exception("evaluation runner: dispatcher step failed")
            self._wake.wait(wait)
            self._wake.clear()
        connections.close_all()

    def _database_down(self, error: Exception) -> None:
        if not self._down_logged:
            logger.warning(
                "evaluation runner: database unreachable (%s); runs wait until it answers",
                type(error).__name__,
            )
            self._down_logged = True
        self._trust.lost()
        connections.close_all()

    def _tick(self) -> None:
        now = time.monotonic()
        # Queued runs first: a doorbell's run starts before the housekeeping below.
        self._claim_runs()
        if now >= self._next_beat:
            self._beat()
            self._next_beat = now + float(settings.SLUICE_RUN_HEARTBEAT_SECONDS)
        if self._down_logged:
            logger.warning("evaluation runner: the database answers again")
            self._down_logged = False
        if now >= self._next_sweep:
            # Other workers' heartbeats are judged only after a stale window in which this
            # worker's own beats went through without a gap (dispatch.HeartbeatTrust).
            trusts = self._trust.trusts
            swept = len(dispatch.runs_sweep(trust_heartbeats=trusts))
            self.counters.swept += swept
            self.counters.swept += len(load_dispatch.load_runs_sweep(trust_heartbeats=trusts))
            self._next_sweep = now + float(settings.SLUICE_DISPATCH_POLL_SECONDS)
            if swept:
                # Back in the backlog: claimed now, not at the next poll.
                self._claim_runs()
        if self._claiming:
            self._claim_load_runs()

    def _claim_runs(self) -> None:
        free = min(self.slots - self.busy(), self.slots * _WAITING_FACTOR - self.in_flight())
        if not self._claiming or free <= 0:
            return
        runs = dispatch.runs_claim(self.worker_id, free)
        for index, run in enumerate(runs):
            try:
                self._start(run)
            except Exception:
                # Not started: this run and the rest of the batch go back to the backlog (or,
                # if the database is gone too, to the sweeper once their heartbeats are old).
                for left in runs[index:]:
                    if left.claim is not None and left.pk not in self._held:
                        with contextlib.suppress(DatabaseError):
                            dispatch.run_release(left.pk, left.claim)
                raise

    def _claim_load_runs(self) -> None:
        free = self.load_slots - self.load_in_flight()
        for run in load_dispatch.load_runs_claim(self.worker_id, free):
            assert run.claim is not None
            held = _LoadHeld(run=run, token=run.claim)
            with self._lock:
                self._load_held[run.pk] = held
            held.future = self._load_pool.submit(self._execute_load_run, held)

    def _execute_load_run(self, held: _LoadHeld) -> None:
        close_old_connections()
        try:
            load_run_execute_claimed(held.run, held.token, stop=self._load_stop)
        except DatabaseError as error:
            # Its heartbeat stops with it: the sweeper takes it back once it is stale.
            logger.warning("load run %s: database error: %s", held.run.pk, error)
        except Exception:
            logger.exception("load run %s failed", held.run.pk)
            with contextlib.suppress(DatabaseError):
                services.run_fail(
                    held.run,
                    "internal-error",
                    "the harness failed; the worker log has the details",
                    claim=held.token,
                )
        finally:
            with self._lock:
                self._load_held.pop(held.run.pk, None)
            connections.close_all()
            self._wake.set()

    def _beat(self) -> None:
        at = server_clock.now()
        with self._lock:
            loads = {run_id: held.token for run_id, held in self._load_held.items()}
        for run_id in load_dispatch.load_runs_heartbeat(self.worker_id, loads, at=at):
            logger.info(
                "load run %s is no longer this worker's; it stops at its next report", run_id
            )
        with self._lock:
            claims = {run_id: held.token for run_id, held in self._held.items()}
        taken = dispatch.runs_heartbeat(self.worker_id, claims, at=at)
        if self._trust.beat(at):
            logger.warning(
                "evaluation runner: the database stalled (no heartbeat for over %.1f s); other "
                "workers' heartbeats are judged again after a whole stale window",
                self._trust.gap.total_seconds(),
            )
        for run_id in taken:
            with self._lock:
                held = self._held.get(run_id)
            if held is not None and held.future is not None and not held.future.done():
                logger.warning("evaluation %s is no longer this worker's; stopping it", run_id)
                held.lost = True
                held.future.cancel()

    def _start(self, run: EvaluationRun) -> None:
        assert run.claim is not None
        hold: runtime.RunHold | None = None
        try:
            with execute.run_boundary(run):
                # A claimed run starts under the limits of this instant (the safety net under
                # the profile listener), read in the boundary's transaction.
                refresh.catch_up(self.loop.frozen, source="task-start")
                start = execute.evaluation_run_prepare(run)
                with self.loop.frozen():
                    registry, hold = runtime.registry_for_run(start.plan)
                    profile = registry.current_profile(run.workspace.key)
        except execute.RunNotStartable as refused:
            services.run_fail(
                run, refused.error_type, refused.detail, field=refused.field, claim=run.claim
            )
            return
        except BaseException:
            if hold is not None:
                hold.release()
            raise
        if profile is not None:
            start = dataclasses.replace(start, profile_version=profile.profile_version)
        held = _Held(token=run.claim)
        with self._lock:
            previous = self._held.get(run.pk)
            self._held[run.pk] = held
        if previous is not None and previous.future is not None and not previous.future.done():
            # Taken away and claimed again here before a heartbeat noticed: the old claim stops.
            logger.warning("evaluation %s is no longer this worker's; stopping it", run.pk)
            previous.lost = True
            previous.future.cancel()
        self.counters.claimed += 1
        future = asyncio.run_coroutine_threadsafe(
            self._execute(run, held, start, SlotFreeingRegistry(self, registry)), self.loop.loop
        )
        held.future = future
        future.add_done_callback(lambda _: self._ended(run.pk, held, hold))

    def _ended(self, run_id: uuid.UUID, held: _Held, hold: runtime.RunHold) -> None:
        with self._lock:
            # A run taken away and claimed again by this process is held anew meanwhile.
            if self._held.get(run_id) is held:
                del self._held[run_id]
        self.counters.finished += 1
        self._wake.set()
        with contextlib.suppress(RuntimeError):  # the loop is closed: its key spaces with it
            self.loop.loop.call_soon_threadsafe(_release_after_holds, hold)

    # ------------------------------------------------------------------ one run

    async def _execute(
        self,
        run: EvaluationRun,
        held: _Held,
        start: execute.RunStart,
        registry: SlotFreeingRegistry,
    ) -> None:
        token = held.token

        def fail(error_type: str, detail: str, field: str | None = None) -> Callable[[], Any]:
            return lambda: services.run_fail(run, error_type, detail, field=field, claim=token)

        try:
            outcome = await execute.evaluate(
                start.request,
                cast(AdmissionRegistry, registry),
                start.adapters,
                store=self.receipts,
            )
        except InvalidDefinitionError as error:
            await self._retrying(held, fail("invalid-definition", error.problem, error.field))
        except (ReceiptConflictError, *_DATABASE_DOWN) as error:
            # Another claimant wrote the receipt, or the database went away mid-run: the run
            # goes back to the backlog and resumes from whatever its receipt says.
            logger.warning("evaluation %s: %s: %s", run.pk, type(error).__name__, error)
            await self._give_back(held, run)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.exception("evaluation %s failed", run.pk)
            detail = f"{type(error).__name__} while evaluating; the worker log has the details"
            await self._retrying(held, fail("internal-error", detail))
        else:
            if start.profile_version is not None:
                # The version read at the run boundary, whatever a listener applied since.
                outcome = dataclasses.replace(outcome, profile_version=start.profile_version)
            await self._retrying(
                held, lambda: execute.run_complete(run, outcome, start=start, claim=token)
            )

    async def _retrying(self, held: _Held, action: Callable[[], Any]) -> Any:
        """Run `action` in the database thread until it succeeds or the run is lost."""
        wait = _RETRY_FIRST_SECONDS
        while not held.lost:
            try:
                return await in_database_thread(action, self.database)()
            except _DATABASE_DOWN:
                await asyncio.sleep(wait)
                wait = min(_RETRY_MAX_SECONDS, wait * 2)
        return None

    async def _give_back(self, held: _Held, run: EvaluationRun) -> None:
        released = await self._retrying(held, lambda: dispatch.run_release(run.pk, held.token))
        if released:
            self.counters.given_back += 1


def _release_after_holds(hold: runtime.RunHold) -> None:
    """On the loop: give up a run's hold on its key spaces once no permit of an aborted call
    on this loop is still held (such a permit may be a lease in a canary's key space, renewed
    until its call's timeout)."""
    loop = asyncio.get_running_loop()
    end = holds.last_hold_end(loop)
    if end is None or end <= loop.time():
        hold.release()
    else:
        loop.call_at(end, hold.release)


async def _hold_left_seconds() -> float:
    """How long the last permit of an aborted call on this loop is still held."""
    loop = asyncio.get_running_loop()
    end = holds.last_hold_end(loop)
    return 0.0 if end is None else max(0.0, end - loop.time())


class SlotFreeingController:
    """A workspace's controller as one run sees it, counting that run's attempts waiting in
    `acquire` and holding a lease."""

    def __init__(self, controller: Any, run: SlotFreeingRegistry) -> None:
        self._controller = controller
        self._run = run

    async def acquire(self, request: Any) -> Any:
        self._run.attempts_changed(waiting=+1)
        try:
            lease = await self._controller.acquire(request)
        except BaseException:
            self._run.attempts_changed(waiting=-1)
            raise
        self._run.attempts_changed(waiting=-1, holding=+1)
        return _CountedLease(lease, self._run)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._controller, name)


class _CountedLease:
    """A lease whose release tells its run that one attempt no longer holds a permit."""

    def __init__(self, lease: Any, run: SlotFreeingRegistry) -> None:
        self._lease = lease
        self._run: SlotFreeingRegistry | None = run

    def release(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._lease.release(*args, **kwargs)
        finally:
            run, self._run = self._run, None
            if run is not None:
                run.attempts_changed(holding=-1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lease, name)


class SlotFreeingRegistry:
    """A run's registry as its evaluation sees it: its controllers free the run's slot while
    the run waits for admission, that is while some of its attempts wait and none holds a
    permit (a run with calls in flight keeps its slot, however many more of its attempts
    wait)."""

    def __init__(self, runner: Runner, registry: AdmissionRegistry) -> None:
        self._runner = runner
        self._registry = registry
        # Touched on the event loop only.
        self._waiting = 0
        self._holding = 0

    def controller(self, workspace_id: str) -> Any:
        found = self._registry.controller(workspace_id)
        return None if found is None else SlotFreeingController(found, self)

    def attempts_changed(self, *, waiting: int = 0, holding: int = 0) -> None:
        was = self._waiting > 0 and self._holding == 0
        self._waiting += waiting
        self._holding += holding
        now = self._waiting > 0 and self._holding == 0
        if now != was:
            self._runner.admission_wait(+1 if now else -1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)


_lock = threading.Lock()
_runner: Runner | None = None


def current_runner() -> Runner | None:
    return _runner


def start_runner(*, slots: int | None = None) -> Runner:
    """Start this process's runner once (a Celery worker does at `worker_ready`)."""
    global _runner
    with _lock:
        if _runner is None:
            runner = Runner(slots=slots)
            runner.start()
            _runner = runner
        return _runner


def stop_runner() -> None:
    global _runner
    with _lock:
        runner, _runner = _runner, None
    if runner is not None:
        runner.stop()
