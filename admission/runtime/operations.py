"""What admission is doing now, for operators' views (the admin's dashboard, `/metrics`).

With admission coordinated in Redis (`SLUICE_ADMISSION_REDIS_URL`) every figure is the
deployment's: active and queued calls, limits, breakers, per-minute decision counts and running
totals, read with one `state` call per workspace (`RedisCoordinator.state_sync`). With admission
kept inside the one worker process, the same figures come from what that worker publishes to
the database every few seconds (`admission.runtime.live`); a view says when none was published.

Count keys are `(provider, kind, reason)`: kind `admit`, `defer` or `reject` for decisions,
`delay` for the admitted queue delay (reason a bucket's upper bound in ms, `inf`, or `sum`),
`transition` for breaker transitions (reason `<from>><to>`). No principal id is ever part of one.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Max

from admission.coordination import CoordinationUnavailable
from admission.coordination.controller import limits_record
from admission.core import InvalidProfileError
from admission.models import ProfileChangeRecord, ProfileVersion, Workspace
from admission.runtime import live as live_figures
from admission.runtime import registry as runtime

__all__ = [
    "DECISIONS",
    "DELAY_BOUNDS_MS",
    "CountKey",
    "ProviderView",
    "WorkspaceView",
    "deployment_views",
    "workspace_view",
]

DECISIONS = ("admit", "defer", "reject")
# The admitted queue delay's histogram buckets (upper bounds, ms), as the shared state keeps them.
DELAY_BOUNDS_MS = (0, 5, 25, 100, 250, 1000, 2500, 10000, 30000)

CountKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class ProviderView:
    """One provider lane of one workspace. `limits` is the compact record the scripts read
    (`c` concurrency, `ql` queue length, `rpm`, `tps`, `bk` breaker, ...)."""

    provider_id: str
    limits: Mapping[str, Any]
    active: int | None = None
    queued: int | None = None
    breaker: str | None = None
    failures: int = 0
    paused_ms: float = 0.0
    reopens_in_ms: float | None = None


@dataclass(frozen=True, slots=True)
class WorkspaceView:
    """One workspace now. Live figures are None unless Redis answered (`coordinated`) or a
    worker published them (`published`); `unavailable` says why Redis did not answer.
    `publishers` is how many worker processes published fresh figures (in-process mode)."""

    workspace_key: str
    coordinated: bool
    revision: str | None
    shared_revision: str | None = None
    limits: Mapping[str, Any] = field(default_factory=dict)
    active: int | None = None
    queued: int | None = None
    providers: dict[str, ProviderView] = field(default_factory=dict)
    principals: int | None = None
    leases: int | None = None
    waiters: int | None = None
    # minute start (epoch ms) -> count key -> count, for the minutes asked for
    counts: dict[int, dict[CountKey, int]] = field(default_factory=dict)
    totals: dict[CountKey, int] = field(default_factory=dict)
    # newest first: {"providerId", "from", "to", "atEpochMs", "failures"}
    transitions: list[dict[str, Any]] = field(default_factory=list)
    now_ms: float = 0.0
    unavailable: str = ""
    published: bool = False
    publishers: int = 0

    @property
    def live(self) -> bool:
        return (self.coordinated or self.published) and not self.unavailable


def _key(stored: str) -> CountKey:
    # Provider ids may hold any character; kind and reason never hold a '|'.
    provider, kind, reason = stored.rsplit("|", 2)
    return provider, kind, reason


def _counted(raw: Mapping[str, Any]) -> dict[CountKey, int]:
    return {_key(k): int(v) for k, v in raw.items()}


def _active_version(workspace: Workspace) -> tuple[int, str, str] | None:
    """The id, label and limits digest of the workspace's active version (the latest
    activation), without loading its document."""
    return (
        ProfileChangeRecord.objects.filter(workspace=workspace)
        .order_by("-id")
        .values_list("version_id", "version__profile_version", "version__profile_digest")
        .first()
    )


@functools.lru_cache(maxsize=256)
def _version_limits(
    version_id: int, profile_digest: str
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A version's workspace and provider limits. Versions never change (the digest makes the
    key exact all the same), so each is parsed once per process: a profile may name thousands
    of principals."""
    version = ProfileVersion.objects.select_related("workspace").get(pk=version_id)
    try:
        profile = runtime.profile_from_version(version)
    except InvalidProfileError:
        return {}, {}
    providers = {pid: limits_record(limits) for pid, limits in profile.providers.items()}
    return limits_record(profile.workspace), providers


ActiveVersion = tuple[int, str, str]


def _active_versions(workspaces: list[Workspace]) -> dict[int, ActiveVersion]:
    """`_active_version` of many workspaces (by workspace id) in two queries."""
    latest = (
        ProfileChangeRecord.objects.filter(workspace__in=workspaces)
        .values("workspace_id")
        .annotate(last=Max("id"))
        .values_list("last", flat=True)
    )
    rows = ProfileChangeRecord.objects.filter(id__in=list(latest)).values_list(
        "workspace_id", "version_id", "version__profile_version", "version__profile_digest"
    )
    return {row[0]: (row[1], row[2], row[3]) for row in rows}


def _profile_limits(
    workspace: Workspace, active: ActiveVersion | bool | None = False
) -> tuple[str | None, dict[str, Any], dict[str, Any]]:
    """The active version's label, workspace limits and provider limits, from the database
    (`active`, when given, is what `_active_version` would say)."""
    if active is False:
        active = _active_version(workspace)
    if not isinstance(active, tuple):
        return None, {}, {}
    limits, providers = _version_limits(active[0], active[2])
    return active[1], dict(limits), {pid: dict(lim) for pid, lim in providers.items()}


def workspace_view(
    workspace: Workspace,
    *,
    minutes: int = 60,
    unreachable: str = "",
    active: ActiveVersion | bool | None = False,
    published: Mapping[str, Any] | None = None,
) -> WorkspaceView:
    """The workspace now, with per-minute counts of the last `minutes`. `unreachable` (why
    Redis failed a moment ago) skips the read: the view says so instead. `published` is what
    `admission.runtime.live.published_states` gave (read once per page for many workspaces)."""
    revision, limits, provider_limits = _profile_limits(workspace, active)
    observer = runtime.shared_state_observer()
    now_ms = time.time() * 1000.0
    providers = {pid: ProviderView(pid, lim) for pid, lim in provider_limits.items()}
    if observer is None:
        if published is None:
            published = live_figures.published_states(minutes=minutes)
        state = published.get(workspace.key)
        if state is None:
            return WorkspaceView(
                workspace.key, False, revision, limits=limits, providers=providers, now_ms=now_ms
            )
        return _from_state(workspace.key, revision, limits, providers, state, coordinated=False)
    try:
        if unreachable:
            raise CoordinationUnavailable(unreachable)
        state = observer.state_sync(workspace.key, minutes=minutes)
    except CoordinationUnavailable as error:
        reason = f"the admission Redis did not answer ({str(error).split(':', 1)[0]})"
        return WorkspaceView(
            workspace.key,
            True,
            revision,
            limits=limits,
            providers=providers,
            now_ms=now_ms,
            unavailable=reason,
        )
    return _from_state(workspace.key, revision, limits, providers, state)


def _from_state(
    key: str,
    revision: str | None,
    limits: dict[str, Any],
    providers: dict[str, ProviderView],
    state: Mapping[str, Any],
    *,
    coordinated: bool = True,
) -> WorkspaceView:
    shared = dict(providers)
    for pid, entry in (state.get("providers") or {}).items():
        stored = entry.get("limits") or providers.get(pid, ProviderView(pid, {})).limits
        reopen = entry.get("reopen")
        shared[pid] = ProviderView(
            pid,
            stored,
            active=int(entry.get("a") or 0),
            queued=int(entry.get("q") or 0),
            breaker=str(entry.get("breaker") or "closed"),
            failures=int(entry.get("failures") or 0),
            paused_ms=float(entry.get("pause") or 0.0),
            reopens_in_ms=float(reopen) if reopen is not None else None,
        )
    for pid, view in list(shared.items()):
        if view.active is None:
            # Named by the active profile but not (yet) in the shared state: idle.
            shared[pid] = ProviderView(pid, view.limits, active=0, queued=0, breaker="closed")
    workspace = state.get("workspace") or {}
    return WorkspaceView(
        key,
        coordinated,
        revision,
        published=not coordinated,
        publishers=int(state.get("processes") or 0),
        shared_revision=state.get("rev"),
        limits=workspace.get("limits") or limits,
        active=int(workspace.get("a") or 0),
        queued=int(workspace.get("q") or 0),
        providers=dict(sorted(shared.items())),
        principals=int(state.get("principals") or 0),
        leases=int(state.get("leases") or 0),
        waiters=int(state.get("waiters") or 0),
        counts={int(minute): _counted(c) for minute, c in (state.get("counts") or {}).items()},
        totals=_counted(state.get("totals") or {}),
        transitions=list(state.get("transitions") or []),
        now_ms=float(state.get("now") or time.time() * 1000.0),
    )


def deployment_views(
    workspaces: Iterable[Workspace] | None = None, *, minutes: int = 0
) -> list[WorkspaceView]:
    """Every workspace that has an active profile (or those given), in key order."""
    if workspaces is None:
        active = ProfileChangeRecord.objects.values("workspace_id")
        workspaces = Workspace.objects.filter(pk__in=active).order_by("key")
    shown = list(workspaces)
    actives = _active_versions(shown)
    published = None
    if runtime.coordination_settings() is None:
        published = live_figures.published_states(minutes=minutes)
    views: list[WorkspaceView] = []
    unreachable = ""
    for workspace in shown:
        view = workspace_view(
            workspace,
            minutes=minutes,
            unreachable=unreachable,
            active=actives.get(workspace.pk),
            published=published,
        )
        if view.unavailable and not unreachable:
            # One timeout per page, not one per workspace, while Redis is away.
            unreachable = view.unavailable.rsplit("(", 1)[-1].rstrip(")")
        views.append(view)
    return views
