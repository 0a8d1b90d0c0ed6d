"""One controller per workspace, the ledger of registered profile revisions, and listeners.

The registry is the `hosting.ControllerHost` of its controllers and manages them only through
`hosting.HostedController`.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from admission.core.clock import SystemClock
from admission.core.controller import AdmissionController
from admission.core.errors import ProfileConflictError
from admission.core.evidence import ProfileChangeRecord
from admission.core.hosting import HostedController
from admission.core.shadow import ShadowAdmission

if TYPE_CHECKING:
    from admission.core.clock import Clock
    from admission.core.evidence import AdmissionEvidence, BreakerTransition
    from admission.core.limits import Profile
    from admission.core.request import AdmissionRequest

logger = logging.getLogger(__name__)

PROFILE_HISTORY = 256

_C = TypeVar("_C", bound=HostedController)


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """One admission decision as the host's telemetry sees it; `defer` exists only here."""

    decision: str
    reason: str
    request: AdmissionRequest
    evidence: AdmissionEvidence | None


@dataclass(slots=True)
class _Ledger:
    """Registered revisions of one workspace; kept for the life of the process."""

    digests: dict[str, str] = field(default_factory=dict)
    current: str | None = None
    profile: Profile | None = None
    history: deque[ProfileChangeRecord] = field(
        default_factory=lambda: deque(maxlen=PROFILE_HISTORY)
    )


class AdmissionRegistry:
    """The process-wide home of admission state, keyed by trusted workspace id."""

    def __init__(
        self,
        clock: Clock | None = None,
        max_idle_scopes: int = 1024,
        rng: random.Random | None = None,
        controller_factory: Callable[[AdmissionRegistry, Profile], HostedController] | None = None,
    ) -> None:
        if type(max_idle_scopes) is not int or max_idle_scopes < 0:
            raise ValueError("max_idle_scopes must be a non-negative integer")
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.max_idle_scopes = max_idle_scopes
        self.rng = rng if rng is not None else random.Random()
        # Another kind of controller (deployment-wide admission) plugs in here.
        self._controller_factory = controller_factory or AdmissionController
        self._controllers: dict[str, HostedController] = {}
        self._ledgers: dict[str, _Ledger] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()
        self._profile_listeners: list[Callable[[ProfileChangeRecord], Any]] = []
        self._breaker_listeners: list[Callable[[BreakerTransition], Any]] = []
        self._decision_listeners: list[Callable[[DecisionEvent], Any]] = []
        self._shadows: dict[str, ShadowAdmission] = {}
        self.reports_decisions = False
        self.evicts_idle = False

    def register(self, profile: Profile, *, sequence: int | None = None) -> AdmissionController:
        """Make `profile` current for its workspace; an earlier revision again is a rollback.

        `sequence` is the host's ledger position of this activation (deployment-wide admission
        uses it to order revisions across processes). Raises `ProfileConflictError`, before
        anything changes, when the revision label is already registered with other limits.
        """
        workspace_id = profile.workspace_id
        ledger = self._ledgers.get(workspace_id)
        if ledger is None:
            ledger = _Ledger()
        known = ledger.digests.get(profile.profile_version)
        if known is not None and known != profile.profile_digest:
            raise ProfileConflictError(
                workspace_id, profile.profile_version, known, profile.profile_digest
            )
        self._ledgers[workspace_id] = ledger
        if ledger.current == profile.profile_version:
            current = self._controller_for(workspace_id, create=True)
            if sequence is not None:
                self.note_sequence(workspace_id, sequence)
            return current  # type: ignore[return-value]
        if ledger.current is None:
            kind = "initial"
        elif known is not None:
            kind = "rollback"
        else:
            kind = "change"
        previous = ledger.current
        ledger.digests[profile.profile_version] = profile.profile_digest
        ledger.current = profile.profile_version
        ledger.profile = profile
        controller = self._controllers.get(workspace_id)
        if controller is None:
            controller = self._controller_for(workspace_id, create=True)
        else:
            controller.apply_profile(profile)
        record = ProfileChangeRecord(
            workspace_id=workspace_id,
            kind=kind,
            previous_profile_version=previous,
            profile_version=profile.profile_version,
            digest=profile.digest,
            profile_digest=profile.profile_digest,
            at_epoch_ms=self.clock.epoch_ms(),
        )
        ledger.history.append(record)
        for callback in list(self._profile_listeners):
            self._call(callback, record)
        assert controller is not None
        if sequence is not None:
            self.note_sequence(workspace_id, sequence)
        return cast(AdmissionController, controller)

    def note_sequence(self, workspace_id: str, sequence: int) -> None:
        """The host's ledger position of the workspace's current revision (a no-op for
        in-process controllers)."""
        controller = self._controller_for(workspace_id, create=True)
        note = getattr(controller, "_note_sequence", None)
        if note is not None:
            note(sequence)

    def controller(self, workspace_id: str) -> AdmissionController | None:
        """The workspace's controller, or None when no profile was ever registered for it."""
        return self._controller_for(workspace_id, create=True)

    def current_profile(self, workspace_id: str) -> Profile | None:
        ledger = self._ledgers.get(workspace_id)
        return ledger.profile if ledger is not None else None

    def profile_history(self, workspace_id: str) -> list[ProfileChangeRecord]:
        """The bounded history of profile changes for the workspace, oldest first."""
        ledger = self._ledgers.get(workspace_id)
        return list(ledger.history) if ledger is not None else []

    def start_shadow(
        self, profile: Profile, *, session: Any = None, registry: AdmissionRegistry | None = None
    ) -> ShadowAdmission:
        """Decide every later request of `profile`'s workspace again, in dry run, under
        `profile` (`admission.core.shadow`); a running shadow of the workspace is stopped.

        `registry` hosts the shadow's controller (a registry of its own on this one's clock by
        default); a host that shares admission between processes passes one whose controllers
        share the shadow's state between them, apart from the real state."""
        host = registry if registry is not None else AdmissionRegistry(clock=self.clock)
        shadow = ShadowAdmission(profile, clock=self.clock, host=host, session=session)
        previous = self._shadows.get(profile.workspace_id)
        if previous is not None:
            previous.stop()
        self._shadows[profile.workspace_id] = shadow
        return shadow

    def stop_shadow(self, workspace_id: str) -> ShadowAdmission | None:
        """Stop the workspace's shadow; returns it (with its last tallies) or None."""
        shadow = self._shadows.pop(workspace_id, None)
        if shadow is not None:
            shadow.stop()
        return shadow

    def shadow(self, workspace_id: str) -> ShadowAdmission | None:
        """The workspace's running shadow, or None."""
        return self._shadows.get(workspace_id)

    def on_profile_change(
        self, callback: Callable[[ProfileChangeRecord], Any]
    ) -> Callable[[], None]:
        return self._subscribe(self._profile_listeners, callback)

    def on_breaker_transition(
        self, callback: Callable[[BreakerTransition], Any]
    ) -> Callable[[], None]:
        return self._subscribe(self._breaker_listeners, callback)

    def on_decision(self, callback: Callable[[DecisionEvent], Any]) -> Callable[[], None]:
        """Every admit, reject and defer decision, for telemetry; costs nothing when unused."""
        return self._subscribe(self._decision_listeners, callback)

    # ------------------------------------------- hosting.ControllerHost (for controllers)

    def report_breaker_transition(self, transition: BreakerTransition) -> None:
        for callback in list(self._breaker_listeners):
            self._call(callback, transition)

    def report_decision(
        self,
        decision: str,
        reason: str,
        request: AdmissionRequest,
        evidence: AdmissionEvidence | None,
    ) -> None:
        event = DecisionEvent(decision, reason, request, evidence)
        for callback in list(self._decision_listeners):
            self._call(callback, event)

    def adopt(self, controller: _C) -> _C:
        """The live controller for an evicted one's workspace; it takes its old place if free."""
        live = self._controllers.get(controller.workspace_id)
        if live is not None and live is not controller:
            return cast(_C, live)
        controller.evicted = False
        self._controllers[controller.workspace_id] = controller
        self._count_controllers()
        ledger = self._ledgers[controller.workspace_id]
        if ledger.profile is not None and ledger.profile is not controller.applied_profile:
            controller.apply_profile(ledger.profile)
        return controller

    def note_idle(self, controller: HostedController) -> None:
        # Idleness only matters once there are more controllers than may idle.
        if len(self._controllers) <= self.max_idle_scopes:
            return
        idle = self._idle
        workspace_id = controller.workspace_id
        idle[workspace_id] = None
        idle.move_to_end(workspace_id)
        if len(idle) <= self.max_idle_scopes:
            return
        now = self.clock.monotonic_ms()
        for _ in range(2):
            if len(idle) <= self.max_idle_scopes:
                return
            candidate, _ = idle.popitem(last=False)
            existing = self._controllers.get(candidate)
            if existing is None:
                continue
            if existing.is_idle(now):
                # Only state is dropped; the ledger of revisions stays.
                existing.evicted = True
                del self._controllers[candidate]
                self._count_controllers()
            elif not existing.is_busy():
                idle[candidate] = None

    # ----------------------------------------------------------- internals

    def _subscribe(self, listeners: list[Any], callback: Callable[..., Any]) -> Callable[[], None]:
        listeners.append(callback)
        self.reports_decisions = bool(self._decision_listeners)

        def unsubscribe() -> None:
            if callback in listeners:
                listeners.remove(callback)
            self.reports_decisions = bool(self._decision_listeners)

        return unsubscribe

    @staticmethod
    def _call(callback: Callable[..., Any], payload: Any) -> None:
        try:
            callback(payload)
        except Exception:
            # A failing listener never breaks admission.
            logger.exception("admission listener %r failed", callback)

    def _controller_for(self, workspace_id: str, *, create: bool) -> AdmissionController | None:
        # Typed as the default kind; a plugged-in factory's controllers offer the same API.
        controller = cast("AdmissionController | None", self._controllers.get(workspace_id))
        if controller is not None or not create:
            return controller
        ledger = self._ledgers.get(workspace_id)
        if ledger is None or ledger.profile is None:
            return None
        created = self._controller_factory(self, ledger.profile)
        self._controllers[workspace_id] = created
        self._count_controllers()
        return cast(AdmissionController, created)

    def _count_controllers(self) -> None:
        self.evicts_idle = len(self._controllers) > self.max_idle_scopes
