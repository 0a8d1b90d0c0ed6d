"""Pure-Python admission control: limits, buckets, breaker, controller, registry, evidence.

This package imports neither Django, DRF nor Celery.
"""

from admission.core.canonical import canonical_json, sha256_digest
from admission.core.clock import Clock, SystemClock, VirtualTimeLoop
from admission.core.controller import AdmissionController, Lease
from admission.core.errors import (
    REASONS,
    RETRYABLE_REASONS,
    AdmissionRejected,
    InvalidProfileError,
    ProfileConflictError,
    ServiceError,
)
from admission.core.evidence import (
    AdmissionEvidence,
    BreakerTransition,
    ProfileChangeRecord,
    QueueSnapshot,
)
from admission.core.limits import BreakerConfig, Limits, Profile
from admission.core.registry import AdmissionRegistry, DecisionEvent
from admission.core.request import AdmissionRequest, Estimate
from admission.core.shadow import ShadowAdmission, ShadowCall, Tally, merge_tallies
from admission.core.signal import CancelSignal

__all__ = [
    "REASONS",
    "RETRYABLE_REASONS",
    "AdmissionController",
    "AdmissionEvidence",
    "AdmissionRegistry",
    "AdmissionRejected",
    "AdmissionRequest",
    "BreakerConfig",
    "BreakerTransition",
    "CancelSignal",
    "Clock",
    "DecisionEvent",
    "Estimate",
    "InvalidProfileError",
    "Lease",
    "Limits",
    "Profile",
    "ProfileChangeRecord",
    "ProfileConflictError",
    "QueueSnapshot",
    "ServiceError",
    "ShadowAdmission",
    "ShadowCall",
    "SystemClock",
    "Tally",
    "VirtualTimeLoop",
    "canonical_json",
    "merge_tallies",
    "sha256_digest",
]
