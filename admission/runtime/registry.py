"""The per-process admission runtime: one core registry, fed from the database ledger.

The database is the durable ledger of activations; the core registry is this process's copy.
Before the registry hears of a new activation it replays the workspace's ledger in order, so
the core's `kind` and `previousProfileVersion` agree with the database in every process. Each
registration carries its ledger row id, which orders revisions across processes when admission
is coordinated in Redis (`SLUICE_ADMISSION_REDIS_URL`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction

from admission.coordination import CoordinationSettings, RedisCoordinator
from admission.core import AdmissionRegistry, Profile
from admission.models import ProfileChangeRecord, ProfileVersion
from admission.runtime.canary import CanaryRegistry

if TYPE_CHECKING:
    from admission.core import ProfileChangeRecord as CoreChangeRecord
    from admission.rollout.plan import RunPlan

_lock = threading.RLock()
_registry: AdmissionRegistry | None = None
# workspace key -> id of the last ledger row this process's registry has replayed
_applied: dict[str, int] = {}
# workspace key -> (canary start row id, the canary version's own registry)
_canaries: dict[str, tuple[int, AdmissionRegistry]] = {}


def coordination_settings() -> CoordinationSettings | None:
    """The deployment's coordinated-admission settings, or None when admission is in-process."""
    url = settings.SLUICE_ADMISSION_REDIS_URL
    if not url:
        return None
    try:
        return CoordinationSettings(
            url=url,
            prefix=settings.SLUICE_ADMISSION_KEY_PREFIX,
            lease_ttl_ms=settings.SLUICE_ADMISSION_LEASE_TTL_MS,
            heartbeat_ms=settings.SLUICE_ADMISSION_HEARTBEAT_MS,
            recovery_grace_ms=settings.SLUICE_ADMISSION_RECOVERY_GRACE_MS,
            timeout_ms=settings.SLUICE_ADMISSION_TIMEOUT_MS,
            idle_ttl_ms=settings.SLUICE_ADMISSION_IDLE_TTL_MS,
            budget_ttl_ms=settings.SLUICE_ADMISSION_BUDGET_TTL_MS,
            on_failure=settings.SLUICE_ADMISSION_ON_REDIS_FAILURE,
            expected_processes=settings.SLUICE_ADMISSION_EXPECTED_WORKERS,
        )
    except ValueError as error:
        raise ImproperlyConfigured(f"SLUICE_ADMISSION_*: {error}") from None


def build_registry() -> AdmissionRegistry:
    """A registry whose controllers are coordinated in Redis when the deployment says so."""
    coordination = coordination_settings()
    if coordination is None:
        return AdmissionRegistry()
    coordinator = RedisCoordinator(coordination, on_stale=refresh_workspace_async)
    return AdmissionRegistry(controller_factory=coordinator.controller)


_observer: RedisCoordinator | None = None


def shared_state_observer() -> RedisCoordinator | None:
    """A coordinator for reading the deployment's shared admission state from this process
    (`state_sync`), or None when admission is in-process. It takes no part in admission."""
    global _observer
    coordination = coordination_settings()
    if coordination is None:
        return None
    with _lock:
        if _observer is None or _observer.settings != coordination:
            _observer = RedisCoordinator(coordination, process_id="observer")
        return _observer


_registry_factory: Callable[[], AdmissionRegistry] = build_registry
# Called with each registry this process builds (the live figures' tally attaches to it).
_built_hooks: list[Callable[[AdmissionRegistry], None]] = []
# Called with each canary version's own registry this process builds (the tally counts its
# decisions too).
_canary_hooks: list[Callable[[AdmissionRegistry], None]] = []


def on_registry_built(callback: Callable[[AdmissionRegistry], None]) -> Callable[[], None]:
    """Call `callback(registry)` whenever `get_registry` builds a registry; returns a function
    that stops it."""
    _built_hooks.append(callback)

    def forget() -> None:
        if callback in _built_hooks:
            _built_hooks.remove(callback)

    return forget


def on_canary_registry(callback: Callable[[AdmissionRegistry], None]) -> Callable[[], None]:
    """Call `callback(registry)` with every canary registry this process holds now and builds
    from now on; returns a function that stops it."""
    _canary_hooks.append(callback)
    with _lock:
        held = [registry for _, registry in _canaries.values()]
    for registry in held:
        callback(registry)

    def forget() -> None:
        if callback in _canary_hooks:
            _canary_hooks.remove(callback)

    return forget


def applied_workspaces() -> list[str]:
    """Keys of the workspaces whose ledger this process's registry has replayed."""
    with _lock:
        return list(_applied)


def profile_from_version(version: ProfileVersion) -> Profile:
    """The only place a stored version becomes a core `Profile`."""
    return Profile.from_dict(version.document, workspace_id=version.workspace.key)


def get_registry() -> AdmissionRegistry:
    """This process's registry, built lazily from every workspace's ledger in activation order."""
    global _registry
    with _lock:
        if _registry is None:
            registry = _registry_factory()
            _applied.clear()
            _replay(registry, workspace_key=None)
            _registry = registry
            for hook in list(_built_hooks):
                hook(registry)
        return _registry


def reset_registry(factory: Callable[[], AdmissionRegistry] | None = None) -> None:
    """Forget this process's registry; the next `get_registry()` rebuilds it from the ledger.

    Tests and worker process init call this; `factory` lets a test inject a registry with a
    virtual clock.
    """
    global _registry, _registry_factory
    with _lock:
        _registry = None
        _applied.clear()
        _canaries.clear()
        _spaces.clear()
        _runs_by_workspace.clear()
        if factory is not None:
            _registry_factory = factory


def refresh_workspace(workspace_key: str) -> None:
    """Replay ledger rows of one workspace that this process has not registered yet."""
    with _lock:
        registry = get_registry()
        _replay(registry, workspace_key=workspace_key)


async def refresh_workspace_async(workspace_key: str) -> None:
    """Bring one workspace up to the ledger from the process's event loop: the rows are read
    in a thread, the registry changes on the loop (whose controllers are not thread-safe)."""
    registry = get_registry()
    after = _applied.get(workspace_key, 0)
    rows = await asyncio.to_thread(_ledger_rows, workspace_key, after)
    with _lock:
        for row_id, profile in rows:
            if row_id > _applied.get(workspace_key, 0):
                registry.register(profile, sequence=row_id)
                _applied[workspace_key] = row_id
        latest = _applied.get(workspace_key)
    if latest is not None:
        registry.note_sequence(workspace_key, latest)


def _ledger_rows(workspace_key: str, after: int) -> list[tuple[int, Profile]]:
    try:
        records = (
            ProfileChangeRecord.objects.select_related("version__workspace")
            .filter(workspace__key=workspace_key, id__gt=after)
            .order_by("id")
        )
        return [(record.id, profile_from_version(record.version)) for record in records]
    finally:
        connections.close_all()


def register_activation(version: ProfileVersion) -> CoreChangeRecord | None:
    """Register `version` after catching up with the ledger; return the core's change record.

    Callers hold the workspace's row lock, so no other activation of this workspace can slip
    in between the catch-up and the registration. Returns None when the revision was already
    current in the core (nothing changed).
    """
    profile = profile_from_version(version)
    with _lock:
        registry = get_registry()
        _replay(registry, workspace_key=profile.workspace_id)
        captured: list[CoreChangeRecord] = []

        def capture(record: CoreChangeRecord) -> None:
            if record.workspace_id == profile.workspace_id:
                captured.append(record)

        unsubscribe = registry.on_profile_change(capture)
        try:
            registry.register(profile)
        finally:
            unsubscribe()
        return captured[-1] if captured else None


class RunHold:
    """What one run of this process uses among the canary and shadow key spaces; `release` it
    when the run ends (the runner does), so a replaced key space closes after its last run."""

    __slots__ = ("_canary", "_released", "_workspace")

    def __init__(self, workspace_key: str, canary: _KeySpace | None) -> None:
        self._workspace = workspace_key
        self._canary = canary
        self._released = False

    def release(self) -> None:
        with _lock:
            if self._released:
                return
            self._released = True
            if self._canary is None:
                _runs_by_workspace.get(self._workspace, set()).discard(self)
            for space in list(_spaces.values()):
                if self in space.users:
                    space.users.discard(self)
                    if space.retired and not space.users:
                        _close(space)


@dataclasses.dataclass(eq=False)
class _KeySpace:
    """A canary's or a shadow's registry in this process (its own key space in Redis with
    deployment-wide admission), and the runs that may still use it."""

    name: str
    # An AdmissionRegistry (a shadow's host is typed by the core as what hosts controllers).
    registry: Any
    # With deployment-wide admission: the coordinator of its controllers (its Redis clients),
    # closed with the key space.
    coordinator: RedisCoordinator | None = None
    users: set[RunHold] = dataclasses.field(default_factory=set)
    retired: bool = False


# Open key spaces, by the id of their registry.
_spaces: dict[int, _KeySpace] = {}
# Runs of each workspace in flight here that admit through the process registry (so through its
# shadow, whichever is current while they run).
_runs_by_workspace: dict[str, set[RunHold]] = {}


def registry_for_run(plan: RunPlan) -> tuple[AdmissionRegistry, RunHold]:
    """Bring this process's shadow of the plan's workspace in line with `plan` and return the
    registry the run admits through, with the run's hold on the key spaces it uses: for a
    canary run, a registry whose controllers admit under the canary version's limits and also
    take the active version's shared pools (`admission.runtime.canary`), else the process
    registry. Release the hold when the run ends.

    A canary's or shadow's registry that is replaced stays open while a run may still use it
    and closes when the last such run ends: a canary's, when the last run admitted through it
    ends; a shadow's, when the last run of its workspace in flight at the replacement ends
    (their requests were mirrored into it).

    Call with the evaluation loop frozen: shadows and registries belong to that loop.
    """
    with _lock:
        registry = get_registry()
        key = plan.workspace_key
        running = registry.shadow(key)
        wanted = plan.shadow
        if wanted is None or wanted.version is None:
            if running is not None:
                _retire(key, registry.stop_shadow(key))
        elif running is None or running.session != wanted.pk:
            profile = profile_from_version(wanted.version)
            shared, coordinator = _shared_registry("shadow", wanted.pk, registry)
            if shared is not None:
                # Every process registers the shadow's profile at its start row's position.
                shared.register(profile, sequence=wanted.pk)
            _retire(key, running)
            started = registry.start_shadow(profile, session=wanted.pk, registry=shared)
            _open(f"shadow:{wanted.pk}", started.host, coordinator)
        canary = plan.canary
        if canary is None or canary.version is None:
            _retire(key, _canaries.pop(key, None))
            return registry, _hold(key, None)
        cached = _canaries.get(key)
        if cached is None or cached[0] != canary.pk:
            _retire(key, cached)
            own, coordinator = _shared_registry("canary", canary.pk, registry)
            if own is None:
                own = AdmissionRegistry(clock=registry.clock)
            # Every process registers the canary's profile at the same position: its start row.
            own.register(profile_from_version(canary.version), sequence=canary.pk)
            cached = _canaries[key] = (canary.pk, own)
            _open(f"canary:{canary.pk}", own, coordinator)
            for hook in list(_canary_hooks):
                hook(own)
        if not plan.on_canary:
            return registry, _hold(key, None)
        return cast(AdmissionRegistry, CanaryRegistry(cached[1], registry)), _hold(
            key, _spaces[id(cached[1])]
        )


def open_key_spaces() -> list[str]:
    """The canary and shadow key spaces this process holds open (`canary:<id>`,
    `shadow:<id>`), current or kept for runs still using them."""
    with _lock:
        return sorted(space.name for space in _spaces.values())


def _open(name: str, registry: Any, coordinator: RedisCoordinator | None) -> None:
    _spaces[id(registry)] = _KeySpace(name, registry, coordinator)


def _hold(workspace_key: str, canary: _KeySpace | None) -> RunHold:
    hold = RunHold(workspace_key, canary)
    if canary is not None:
        canary.users.add(hold)
    else:
        _runs_by_workspace.setdefault(workspace_key, set()).add(hold)
    return hold


def _shared_registry(
    kind: str, pk: int, registry: AdmissionRegistry
) -> tuple[AdmissionRegistry | None, RedisCoordinator | None]:
    """With deployment-wide admission, a registry on the process registry's clock whose
    controllers are coordinated in Redis under a key space of this canary's or shadow's own
    (`<prefix>:<kind>:<pk>`), and its coordinator: its limits hold for every process together,
    and nothing of it touches the active version's counters. (None, None) when admission is
    in-process."""
    coordination = coordination_settings()
    if coordination is None:
        return None, None
    own = dataclasses.replace(coordination, prefix=f"{coordination.prefix}:{kind}:{pk}")
    coordinator = RedisCoordinator(own)
    return AdmissionRegistry(
        clock=registry.clock, controller_factory=coordinator.controller
    ), coordinator


def _retire(workspace_key: str, held: Any) -> None:
    """A canary (start row, registry) or shadow of `workspace_key` was replaced: close its key
    space now if no run may use it any more, else when the last one ends."""
    if held is None:
        return
    registry = held[1] if isinstance(held, tuple) else held.host
    space = _spaces.get(id(registry))
    if space is None:
        return
    space.retired = True
    if not isinstance(held, tuple):
        # Every run of the workspace in flight may have requests mirrored into the shadow.
        space.users |= _runs_by_workspace.get(workspace_key, set())
    if not space.users:
        _close(space)


def _close(space: _KeySpace) -> None:
    """Forget a key space and close its coordinator (on the loop it runs on)."""
    _spaces.pop(id(space.registry), None)
    coordinator = space.coordinator
    loop = getattr(coordinator, "_loop", None)
    if coordinator is not None and loop is not None and not loop.is_closed():
        asyncio.run_coroutine_threadsafe(coordinator.aclose(), loop)


def mark_applied(workspace_key: str, change_record_id: int) -> None:
    """Note that the registry already holds the ledger row just written for this activation;
    with coordinated admission this also makes it the deployment's current revision."""
    with _lock:
        _applied[workspace_key] = max(_applied.get(workspace_key, 0), change_record_id)
    # Only a committed activation may become the deployment's current revision.
    transaction.on_commit(lambda: _publish_sequence(workspace_key, change_record_id))


def _publish_sequence(workspace_key: str, change_record_id: int) -> None:
    with _lock:
        if _registry is not None and _applied.get(workspace_key) == change_record_id:
            _registry.note_sequence(workspace_key, change_record_id)


def _replay(registry: AdmissionRegistry, workspace_key: str | None) -> None:
    records = ProfileChangeRecord.objects.select_related("version__workspace").order_by("id")
    if workspace_key is not None:
        records = records.filter(
            workspace__key=workspace_key, id__gt=_applied.get(workspace_key, 0)
        )
    for record in records:
        key = record.version.workspace.key
        if record.id <= _applied.get(key, 0):
            continue
        registry.register(profile_from_version(record.version), sequence=record.id)
        _applied[key] = record.id
