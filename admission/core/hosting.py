"""What a registry and the controllers it hosts ask of each other, and nothing more.

The registry creates controllers through a factory (the in-process `AdmissionController` by
default, a deployment-wide one when the host plugs it in), so neither module imports the other's
class: each sees the other only through one of these two protocols.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from admission.core.clock import Clock
    from admission.core.evidence import AdmissionEvidence, BreakerTransition
    from admission.core.limits import Profile
    from admission.core.request import AdmissionRequest

__all__ = ["ControllerHost", "HostedController"]


class HostedController(Protocol):
    """A workspace's controller, as its registry manages it."""

    workspace_id: str
    # Set by the registry when it drops the controller's state; a reference to an evicted
    # controller asks the registry to `adopt` it before doing anything.
    evicted: bool

    @property
    def applied_profile(self) -> Profile:
        """The profile the controller applies now (without asking the registry)."""
        ...

    def apply_profile(self, profile: Profile) -> None:
        """Switch to a newly current profile and revalidate what waits under it."""
        ...

    def is_idle(self, now_ms: float) -> bool:
        """Nothing would change an admission outcome if this controller were forgotten."""
        ...

    def is_busy(self) -> bool:
        """Holds a lease or a waiter (and so will note itself idle again later)."""
        ...


_C = TypeVar("_C", bound=HostedController)


class ControllerHost(Protocol):
    """The registry, as a controller sees it."""

    clock: Clock
    rng: random.Random
    max_idle_scopes: int
    # True while anyone listens to decisions: the only check an admission pays for telemetry.
    reports_decisions: bool
    # True while there are more controllers than may idle: only then is `note_idle` worth a call.
    evicts_idle: bool

    def report_decision(
        self,
        decision: str,
        reason: str,
        request: AdmissionRequest,
        evidence: AdmissionEvidence | None,
    ) -> None:
        """Tell the decision listeners (admit, reject or defer)."""
        ...

    def report_breaker_transition(self, transition: BreakerTransition) -> None:
        """Tell the breaker listeners."""
        ...

    def adopt(self, controller: _C) -> _C:
        """The live controller of an evicted one's workspace (itself, if its place is free)."""
        ...

    def note_idle(self, controller: HostedController) -> None:
        """The controller has no lease and no waiter: the registry may evict it later."""
        ...
