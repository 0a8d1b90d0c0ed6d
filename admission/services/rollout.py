"""Rollout controls of a workspace: the kill switch, shadow profiles and canaries.

Every control is an operator act (`access.OPERATE`) that writes one append-only `RolloutEvent`
(who, when, why), under the workspace's row lock so two operators never both start or stop the
same thing. The rows are the state as well as its audit:

- the kill switch: the latest `parallel-off`/`parallel-on` row says whether bounded parallel
  scheduling is allowed. Workers read it when a run starts (the run boundary): a run that starts
  while it is off runs serially with one permit (`scheduler.enabled` false whatever the request
  asked), and a run in flight keeps the setting it started with;
- a shadow: an approved version whose limits decide every admission request of the workspace
  again, in dry run (`admission.core.shadow`); each evaluation run leaves a `ShadowObservation`
  with both sides' tallies, and `shadow_comparison` reads them back with a verdict per bound;
- a canary: an approved version that runs for named principals and/or a deterministic fraction
  of runs (by the run's invocation id), while every other run stays on the current version;
  promoting activates it (a `change` record), abandoning sends every run back.

Refusals are typed `RolloutError`s naming the field at fault; a missing act is `AccessDenied`.
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from admission import access, selectors
from admission.core import merge_tallies
from admission.core.labels import label_problem
from admission.models import (
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RolloutEvent,
    RunBoundary,
    ShadowObservation,
    Workspace,
)
from admission.rollout.compare import Bound, Comparison, compare_tallies, rejected_count
from admission.rollout.plan import RunPlan, version_label
from admission.services import profiles as services

if TYPE_CHECKING:
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)

__all__ = [
    "Bound",
    "Comparison",
    "RolloutError",
    "RunPlan",
    "canary_abandon",
    "canary_current",
    "canary_promote",
    "canary_routes",
    "canary_runs_comparison",
    "canary_start",
    "fraction_hit",
    "parallel_scheduling_allowed",
    "parallel_scheduling_set",
    "rollout_events",
    "run_boundary_hold",
    "run_plan",
    "shadow_comparison",
    "shadow_current",
    "shadow_observation_record",
    "shadow_start",
    "shadow_stop",
]

MAX_CANARY_PRINCIPALS = 100
Kind = RolloutEvent.Kind


class RolloutError(services.ProfileServiceError):
    """A rollout control was refused; `field` names the input at fault when there is one."""


# --------------------------------------------------------------------------- reads


def rollout_events(*, workspace: Workspace) -> QuerySet[RolloutEvent]:
    """The workspace's rollout audit, newest first."""
    return (
        RolloutEvent.objects.filter(workspace=workspace)
        .select_related("workspace", "version", "actor", "session")
        .order_by("-id")
    )


def parallel_scheduling_allowed(*, workspace: Workspace) -> bool:
    """False while the kill switch is on (the latest `parallel-*` row is `parallel-off`)."""
    latest = _parallel_event(workspace)
    return latest is None or latest.kind == Kind.PARALLEL_ON


def _parallel_event(workspace: Workspace) -> RolloutEvent | None:
    return (
        RolloutEvent.objects.filter(
            workspace=workspace, kind__in=[Kind.PARALLEL_OFF, Kind.PARALLEL_ON]
        )
        .order_by("-id")
        .first()
    )


def _running(workspace: Workspace, kind: str) -> RolloutEvent | None:
    return (
        RolloutEvent.objects.filter(workspace=workspace, kind=kind, closings__isnull=True)
        .select_related("version__workspace", "actor")
        .order_by("-id")
        .first()
    )


def shadow_current(*, workspace: Workspace) -> RolloutEvent | None:
    """The start row of the workspace's running shadow, or None."""
    return _running(workspace, Kind.SHADOW_START)


def canary_current(*, workspace: Workspace) -> RolloutEvent | None:
    """The start row of the workspace's running canary, or None."""
    return _running(workspace, Kind.CANARY_START)


def fraction_hit(key: str, fraction: float) -> bool:
    """Whether `key` falls in the first `fraction` of the hash space: the same key always
    answers the same, and keys spread evenly."""
    point = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64
    return point < fraction


def canary_routes(canary: RolloutEvent, *, principal_id: str, invocation_id: str) -> bool:
    """Whether a run of `principal_id` with `invocation_id` runs on the canary's version."""
    if principal_id in (canary.principals or []):
        return True
    return canary.fraction is not None and fraction_hit(
        f"{canary.pk}:{invocation_id}", canary.fraction
    )


def run_boundary_hold(*, workspace: Workspace) -> None:
    """Hold what a run of `workspace` starts under still until the caller's transaction ends.

    Every change of it (an activation or rollback, a canary started, promoted or abandoned, the
    kill switch, a shadow) locks the workspace row for update in its transaction; this takes
    the row for share, so a run boundary read in the same transaction sees each such change
    wholly before or wholly after, and boundaries do not wait for each other. SQLite serializes
    write transactions itself (`transaction_mode=IMMEDIATE`).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {Workspace._meta.db_table} WHERE id = %s FOR SHARE",
                [workspace.pk],
            )


def run_plan(
    *,
    workspace: Workspace,
    principal_id: str,
    invocation_id: str,
    run_id: str | None = None,
    pinned: bool = False,
) -> RunPlan:
    """The kill switch, shadow and canary as they stand for a run starting now.

    With `run_id` the kill-switch setting and the canary arm are kept at the run's first start
    (`RunBoundary`) and a later start of the same run (a redelivery) gets them back, so a run
    in flight finishes under what it started with. A shadow is read afresh: it only observes.
    A run `pinned` to a profile revision (`scheduler.profileVersion`) never goes to a canary.
    """
    shadow = shadow_current(workspace=workspace)
    running = canary_current(workspace=workspace)
    if run_id is not None:
        kept = RunBoundary.objects.filter(run_id=run_id).select_related("canary__version").first()
        if kept is not None:
            return RunPlan(
                workspace_key=workspace.key,
                parallel_allowed=kept.parallel_allowed,
                shadow=shadow,
                canary=kept.canary if kept.canary is not None else running,
                on_canary=kept.canary is not None,
            )
    on_canary = (
        not pinned
        and running is not None
        and canary_routes(running, principal_id=principal_id, invocation_id=invocation_id)
    )
    plan = RunPlan(
        workspace_key=workspace.key,
        parallel_allowed=parallel_scheduling_allowed(workspace=workspace),
        shadow=shadow,
        canary=running,
        on_canary=on_canary,
    )
    if run_id is not None:
        try:
            with transaction.atomic():
                RunBoundary.objects.create(
                    workspace=workspace,
                    run_id=run_id,
                    parallel_allowed=plan.parallel_allowed,
                    canary=running if on_canary else None,
                )
        except IntegrityError:
            # Another delivery of the same run got there first: take what it kept.
            return run_plan(
                workspace=workspace,
                principal_id=principal_id,
                invocation_id=invocation_id,
                run_id=run_id,
                pinned=pinned,
            )
    return plan


# --------------------------------------------------------------------------- writes


def parallel_scheduling_set(
    *, workspace: Workspace, actor: User, allowed: bool, reason: str = ""
) -> RolloutEvent:
    """Turn the kill switch on (`allowed=False`, a reason required) or off again.

    Runs that start afterwards run under the new setting; runs in flight keep theirs.
    """
    access.require(actor, access.OPERATE, workspace)
    if not allowed and not reason.strip():
        raise RolloutError("turning parallel scheduling off needs a reason", field="reason")
    with transaction.atomic():
        locked = Workspace.objects.select_for_update().get(pk=workspace.pk)
        if parallel_scheduling_allowed(workspace=locked) == allowed:
            state = "allowed" if allowed else "off"
            raise RolloutError(
                f"bounded parallel scheduling is already {state} in {workspace.key}",
                field="enabled",
                code="conflict",
            )
        return RolloutEvent.objects.create(
            workspace=locked,
            kind=Kind.PARALLEL_ON if allowed else Kind.PARALLEL_OFF,
            reason=reason,
            actor=actor,
        )


def _approved_candidate(version: ProfileVersion, what: str) -> None:
    approval = selectors.profile_version_approval(version=version)
    if approval is None or approval.decision != ProfileApproval.Decision.APPROVE:
        state = "rejected" if approval is not None else "not approved yet"
        raise RolloutError(f"{version} is {state}; only approved versions {what}", field="version")
    current = selectors.workspace_current_version(workspace=version.workspace)
    if current is None:
        raise RolloutError(
            f"workspace {version.workspace.key} has no active version to compare with; "
            "activate one first",
            field="version",
        )
    if current.pk == version.pk:
        raise RolloutError(f"{version} is already the current version", field="version")


def shadow_start(*, version: ProfileVersion, actor: User, reason: str = "") -> RolloutEvent:
    """Start `version` (approved, not current) as its workspace's shadow."""
    workspace = version.workspace
    access.require(actor, access.OPERATE, workspace)
    _approved_candidate(version, "run as a shadow")
    with transaction.atomic():
        locked = Workspace.objects.select_for_update().get(pk=workspace.pk)
        running = shadow_current(workspace=locked)
        if running is not None:
            raise RolloutError(
                f"workspace {workspace.key} already shadows {version_label(running)}; "
                "stop it first",
                field="version",
                code="conflict",
            )
        return RolloutEvent.objects.create(
            workspace=locked, kind=Kind.SHADOW_START, version=version, reason=reason, actor=actor
        )


def _close(workspace: Workspace, start_kind: str, kind: str, actor: User, reason: str) -> Any:
    with transaction.atomic():
        locked = Workspace.objects.select_for_update().get(pk=workspace.pk)
        running = _running(locked, start_kind)
        what = "shadow" if start_kind == Kind.SHADOW_START else "canary"
        if running is None:
            raise RolloutError(f"workspace {workspace.key} has no running {what}", code="conflict")
        try:
            with transaction.atomic():
                event = RolloutEvent.objects.create(
                    workspace=locked,
                    kind=kind,
                    version=running.version,
                    session=running,
                    reason=reason,
                    actor=actor,
                )
        except IntegrityError as error:
            raise RolloutError(f"the {what} was closed meanwhile", code="conflict") from error
        return event


def shadow_stop(*, workspace: Workspace, actor: User, reason: str = "") -> RolloutEvent:
    """Stop the workspace's shadow; its observations stay."""
    access.require(actor, access.OPERATE, workspace)
    return _close(workspace, Kind.SHADOW_START, Kind.SHADOW_STOP, actor, reason)


def canary_start(
    *,
    version: ProfileVersion,
    actor: User,
    principals: Sequence[str] = (),
    fraction: float | None = None,
    reason: str = "",
) -> RolloutEvent:
    """Run `version` (approved, never active) for `principals` and/or a `fraction` of runs."""
    workspace = version.workspace
    access.require(actor, access.OPERATE, workspace)
    principals = _check_principals(principals)
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise RolloutError("must be a number", field="fraction")
        if not 0 < fraction < 1:
            raise RolloutError(
                "must be above 0 and below 1 (a canary takes part of the runs)", field="fraction"
            )
    if not principals and fraction is None:
        raise RolloutError(
            "name principals or a fraction of runs for the canary", field="principals"
        )
    _approved_candidate(version, "run as a canary")
    if selectors.profile_version_was_activated(version=version):
        raise RolloutError(
            f"{version} was active before; request a rollback to it instead", field="version"
        )
    with transaction.atomic():
        locked = Workspace.objects.select_for_update().get(pk=workspace.pk)
        running = canary_current(workspace=locked)
        if running is not None:
            raise RolloutError(
                f"workspace {workspace.key} already runs canary {version_label(running)}; "
                "promote or abandon it first",
                field="version",
                code="conflict",
            )
        return RolloutEvent.objects.create(
            workspace=locked,
            kind=Kind.CANARY_START,
            version=version,
            principals=principals,
            fraction=float(fraction) if fraction is not None else None,
            reason=reason,
            actor=actor,
        )


def _check_principals(principals: Any) -> list[str]:
    if isinstance(principals, str) or not isinstance(principals, Sequence):
        raise RolloutError("must be a list of principal ids", field="principals")
    if len(principals) > MAX_CANARY_PRINCIPALS:
        raise RolloutError(f"at most {MAX_CANARY_PRINCIPALS} principals", field="principals")
    checked: list[str] = []
    for principal in principals:
        problem = label_problem(principal)
        if problem is not None:
            raise RolloutError(f"principal id {problem}", field="principals")
        if principal not in checked:
            checked.append(principal)
    return checked


def canary_promote(
    *, workspace: Workspace, actor: User, reason: str = ""
) -> tuple[RolloutEvent, ProfileChangeRecord]:
    """Make the canary's version current for every run (a `change` record) and close it."""
    access.require(actor, access.OPERATE, workspace)
    access.require(actor, access.ACTIVATE, workspace)
    with transaction.atomic():
        event = _close(workspace, Kind.CANARY_START, Kind.CANARY_PROMOTE, actor, reason)
        assert event.version is not None
        record = services.profile_version_activate(version=event.version, actor=actor)
    return event, record


def canary_abandon(*, workspace: Workspace, actor: User, reason: str = "") -> RolloutEvent:
    """Send every run back to the current version; the canary's runs stay as they ran."""
    access.require(actor, access.OPERATE, workspace)
    return _close(workspace, Kind.CANARY_START, Kind.CANARY_ABANDON, actor, reason)


def shadow_observation_record(
    *, session_id: int, run_id: str, active: Mapping[str, Any], shadow: Mapping[str, Any]
) -> ShadowObservation | None:
    """Keep one run's tallies of a shadow; nothing when neither side saw a request."""
    if not active.get("requests") and not shadow.get("requests"):
        return None
    return ShadowObservation.objects.create(
        session_id=session_id, run_id=run_id, active=dict(active), shadow=dict(shadow)
    )


# Comparisons are read incrementally: rows older than COMPARISON_SETTLE (every transaction that
# writes one has committed by then) are folded once into a checkpoint kept in the cache, so each
# page load reads only the rows after it. The plotted series keeps about SERIES_POINTS points.
COMPARISON_SETTLE = dt.timedelta(seconds=60)
COMPARISON_KEPT_SECONDS = 7 * 86_400
SERIES_POINTS = 400

# Reads a window's rows in time order: (from, before) -> rows; None is an open end.
RowsBetween = Callable[[dt.datetime | None, dt.datetime | None], Iterable[Any]]
FoldRows = Callable[[dict[str, Any], Iterable[Any]], dict[str, Any]]


def _thin(series: list[Any]) -> list[Any]:
    if len(series) <= 2 * SERIES_POINTS:
        return series
    thinned = series[::2]
    if thinned[-1] != series[-1]:
        thinned.append(series[-1])
    return thinned


def _folded(key: str, rows_between: RowsBetween, fold: FoldRows, empty: dict[str, Any]) -> Any:
    """`fold` over every row: the settled ones from the kept checkpoint, the rest read now."""
    cache_key = f"comparison:{key}"
    try:
        state = cache.get(cache_key) or copy.deepcopy(empty)
    except Exception:
        # Without the cache the comparison is read whole, as it would be the first time.
        logger.warning("comparison checkpoint %s unreadable; reading every row", key)
        state = copy.deepcopy(empty)
    cutoff = timezone.now() - COMPARISON_SETTLE
    until = dt.datetime.fromisoformat(state["until"]) if state.get("until") else None
    if until is None or until < cutoff:
        state = fold(state, rows_between(until, cutoff))
        state["until"] = cutoff.isoformat()
        state["series"] = _thin(state["series"])
        try:
            cache.set(cache_key, state, COMPARISON_KEPT_SECONDS)
        except Exception:
            logger.warning("comparison checkpoint %s not kept", key)
        until = cutoff
    return fold(copy.deepcopy(state), rows_between(until, None))


def _fold_observations(state: dict[str, Any], rows: Iterable[Any]) -> dict[str, Any]:
    for active, shadow in rows:
        state["requests"] += int(active.get("requests", 0))
        state["rejected"][0] += rejected_count(active)
        state["rejected"][1] += rejected_count(shadow)
        state["series"].append((state["requests"], *state["rejected"]))
        state["count"] += 1
        state["active"] = merge_tallies([state["active"], active])
        state["shadow"] = merge_tallies([state["shadow"], shadow])
    return state


def shadow_comparison(*, session: RolloutEvent) -> Comparison:
    """Active against shadow over the shadow's window, from its observations."""

    def rows_between(since: dt.datetime | None, before: dt.datetime | None) -> Iterable[Any]:
        rows = ShadowObservation.objects.filter(session=session)
        if since is not None:
            rows = rows.filter(at__gte=since)
        if before is not None:
            rows = rows.filter(at__lt=before)
        return rows.order_by("at", "id").values_list("active", "shadow").iterator(chunk_size=500)

    empty = {
        "count": 0,
        "requests": 0,
        "rejected": [0, 0],
        "series": [],
        "active": merge_tallies([]),
        "shadow": merge_tallies([]),
    }
    key = f"shadow:{session.pk}:{session.at.timestamp()}"
    state = _folded(key, rows_between, _fold_observations, empty)
    return Comparison(
        active=state["active"],
        shadow=state["shadow"],
        bounds=compare_tallies(state["active"], state["shadow"]),
        observations=state["count"],
        series=[tuple(point) for point in _thin(state["series"])],
    )


def canary_runs_comparison(*, canary: RolloutEvent, runs_between: RowsBetween) -> Comparison:
    """Current version against canary, from the runs that started while the canary ran.

    `runs_between(from, before)` gives the (profile version, attempts) of those runs that
    finished in that window, in finishing order (they are the evaluator's rows).
    """
    from admission.core import Tally

    label = version_label(canary)

    def fold(state: dict[str, Any], runs: Iterable[Any]) -> dict[str, Any]:
        for profile_version, attempts in runs:
            side = "canary" if profile_version == label else "current"
            tally = Tally()
            _tally_attempts(tally, attempts or [])
            state[side] = merge_tallies([state[side], tally.to_dict()])
            state["count"] += 1
            rejected = [rejected_count(state[name]) for name in ("current", "canary")]
            state["series"].append((state["count"], *rejected))
        return state

    empty = {
        "count": 0,
        "series": [],
        "current": merge_tallies([]),
        "canary": merge_tallies([]),
    }
    closing = canary.closings.order_by("id").first()
    # A canary that closes counts a window of its own: its checkpoint starts again once.
    key = f"canary:{canary.pk}:{canary.at.timestamp()}:{closing.pk if closing else 'open'}"
    state = _folded(key, runs_between, fold, empty)
    current, trial = state["current"], state["canary"]
    return Comparison(
        active=current,
        shadow=trial,
        bounds=compare_tallies(current, trial, other="canary", base="the current version"),
        observations=state["count"],
        series=[tuple(point) for point in _thin(state["series"])],
        series_unit="runs",
    )


def _tally_attempts(tally: Any, attempts: Sequence[Mapping[str, Any]]) -> None:
    for attempt in attempts:
        evidence = attempt.get("evidence") or {}
        tally.requests += 1
        tally.retries += int(attempt.get("number", 1)) > 1
        if attempt.get("sent") or evidence.get("decision") == "admit":
            tally.admitted += 1
        elif evidence.get("decision") == "reject" or not evidence:
            reason = str(attempt.get("reason") or "unknown")
            tally.rejected[reason] = tally.rejected.get(reason, 0) + 1
        delay = float(evidence.get("queueDelayMs") or 0.0)
        if delay > 0:
            tally.deferred += 1
            tally.queue_delay_total_ms += delay
            tally.queue_delay_max_ms = max(tally.queue_delay_max_ms, delay)
        tally.max_queued = max(tally.max_queued, int(evidence.get("queued") or 0))
        tally.max_retry_pressure = max(
            tally.max_retry_pressure, int(evidence.get("retryPressure") or 0)
        )
        for transition in evidence.get("breakerTransitions") or []:
            key = f"{transition.get('from')}->{transition.get('to')}"
            tally.breaker_transitions[key] = tally.breaker_transitions.get(key, 0) + 1
