"""Keep this process's registry in step with activations and rollbacks made by other processes.

Two paths, so a worker never admits under a profile the ledger has moved past:

- a listener thread: on PostgreSQL it LISTENs on the channel that activation notifies at commit
  (`NOTIFY_CHANNEL`, payload = workspace key) and replays that workspace's new ledger rows at
  once; on any other database it polls;
- `catch_up()`, the safety net: one query comparing each workspace's latest ledger row with the
  registry's current revision, run at every task start and every poll interval, so a missed
  notification (listener down, connection lost) costs at most one interval.

Callers pass a `guard`: a context manager under which changing the registry is safe (a worker
freezes its evaluation loop, whose controllers are not thread-safe).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import OuterRef, Subquery

from admission.models import ProfileChangeRecord, Workspace
from admission.runtime import registry as runtime

__all__ = [
    "NOTIFY_CHANNEL",
    "ProfileListener",
    "catch_up",
    "listener",
    "refresh_workspaces",
    "reset_after_fork",
    "start_listener",
    "stop_listener",
]

# The channel activation notifies at commit (`admission.services.profiles`), payload the
# workspace key.
NOTIFY_CHANNEL = "sluice_profiles"

logger = logging.getLogger(__name__)

Guard = Callable[[], AbstractContextManager[Any]]

# Safety-net interval: long where notifications do the work, short where polling is all there is.
POLL_SECONDS_NOTIFY = 30.0
POLL_SECONDS_POLLING = 2.0
_RECONNECT_SECONDS = 1.0


def _unguarded() -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def _ledger_heads() -> list[tuple[str, str]]:
    """(workspace key, profileVersion of its latest activation) for every activated workspace."""
    latest = (
        ProfileChangeRecord.objects.filter(workspace=OuterRef("pk"))
        .order_by("-id")
        .values("profile_version")[:1]
    )
    rows = Workspace.objects.annotate(head=Subquery(latest)).values_list("key", "head")
    return [(key, head) for key, head in rows if head is not None]


def refresh_workspaces(keys: Iterable[str], guard: Guard = _unguarded, *, source: str) -> None:
    """Replay the new ledger rows of `keys` into the registry, under `guard`."""
    keys = sorted(set(keys))
    if not keys:
        return
    with guard():
        for key in keys:
            runtime.refresh_workspace(key)
    registry = runtime.get_registry()
    labels = sorted(
        {profile.profile_version for key in keys if (profile := registry.current_profile(key))}
    )
    logger.info(
        "profile refresh (%s): %d workspace(s) now at %s", source, len(keys), ", ".join(labels)
    )


def catch_up(guard: Guard = _unguarded, *, source: str = "check") -> list[str]:
    """Refresh every workspace whose registry revision is not the ledger's latest; returns them."""
    registry = runtime.get_registry()
    stale = []
    for key, head in _ledger_heads():
        current = registry.current_profile(key)
        if current is None or current.profile_version != head:
            stale.append(key)
    refresh_workspaces(stale, guard, source=source)
    return stale


class ProfileListener(threading.Thread):
    """LISTEN for activations on PostgreSQL (poll elsewhere) and refresh the registry."""

    def __init__(self, guard: Guard = _unguarded, *, poll_seconds: float | None = None) -> None:
        super().__init__(name="sluice-profile-listener", daemon=True)
        self._guard = guard
        self._halt = threading.Event()
        self._listen = (
            connections["default"].vendor == "postgresql" and settings.SLUICE_PROFILE_LISTEN
        )
        default_poll = POLL_SECONDS_NOTIFY if self._listen else POLL_SECONDS_POLLING
        configured = settings.SLUICE_PROFILE_POLL_SECONDS
        self.poll_seconds = poll_seconds or configured or default_poll
        self.listening = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                if self._listen:
                    self._listen_loop()
                else:
                    self._poll_loop()
            except Exception:
                logger.exception("profile listener failed; reconnecting")
                self._halt.wait(_RECONNECT_SECONDS)
            finally:
                self.listening.clear()
                connections.close_all()

    def _check(self, source: str) -> None:
        try:
            catch_up(self._guard, source=source)
        finally:
            connections.close_all()

    def _poll_loop(self) -> None:
        self._check("poll")
        while not self._halt.wait(self.poll_seconds):
            self._check("poll")

    def _listen_loop(self) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(**_connect_kwargs(), autocommit=True) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
            self.listening.set()
            # Whatever was activated while nobody listened is caught up before waiting.
            self._check("listen-start")
            next_check = time.monotonic() + self.poll_seconds
            while not self._halt.is_set():
                for notification in conn.notifies(timeout=1.0):
                    try:
                        refresh_workspaces([notification.payload], self._guard, source="notify")
                    finally:
                        connections.close_all()
                    if self._halt.is_set():
                        break
                if time.monotonic() >= next_check:
                    self._check("poll")
                    next_check = time.monotonic() + self.poll_seconds


def _connect_kwargs() -> dict[str, Any]:
    settings = connections["default"].settings_dict
    kwargs: dict[str, Any] = {"dbname": settings["NAME"]}
    for key, name in (("USER", "user"), ("PASSWORD", "password"), ("HOST", "host")):
        if settings.get(key):
            kwargs[name] = settings[key]
    if settings.get("PORT"):
        kwargs["port"] = int(settings["PORT"])
    return kwargs


_lock = threading.Lock()
_listener: ProfileListener | None = None


def listener() -> ProfileListener | None:
    return _listener


def start_listener(guard: Guard = _unguarded) -> ProfileListener:
    """Start this process's listener once; later calls return the running one."""
    global _listener
    with _lock:
        if _listener is None or not _listener.is_alive():
            _listener = ProfileListener(guard)
            _listener.start()
        return _listener


def stop_listener() -> None:
    global _listener
    with _lock:
        if _listener is not None:
            _listener.stop()
            _listener.join(timeout=5)
            _listener = None


def reset_after_fork() -> None:
    """A forked child has no listener thread; forget the parent's and its lock."""
    global _listener, _lock
    _lock = threading.Lock()
    _listener = None
