"""The per-process admission runtime: one core registry, fed from the database ledger.

The database is the durable ledger of activations; the core registry is this process's copy.
Before the registry hears of a new activation it replays the workspace's ledger in order, so
the core's `kind` and `previousProfileVersion` agree with the database in every process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from admission.core import AdmissionRegistry, Profile
from admission.models import ProfileChangeRecord, ProfileVersion

if TYPE_CHECKING:
    from admission.core import ProfileChangeRecord as CoreChangeRecord

_lock = threading.RLock()
_registry: AdmissionRegistry | None = None
# workspace key -> id of the last ledger row this process's registry has replayed
_applied: dict[str, int] = {}
_registry_factory: Callable[[], AdmissionRegistry] = AdmissionRegistry


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
        if factory is not None:
            _registry_factory = factory


def refresh_workspace(workspace_key: str) -> None:
    """Replay ledger rows of one workspace that this process has not registered yet."""
    with _lock:
        registry = get_registry()
        _replay(registry, workspace_key=workspace_key)


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


def mark_applied(workspace_key: str, change_record_id: int) -> None:
    """Note that the registry already holds the ledger row just written for this activation."""
    with _lock:
        _applied[workspace_key] = max(_applied.get(workspace_key, 0), change_record_id)


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
        registry.register(profile_from_version(record.version))
        _applied[key] = record.id
