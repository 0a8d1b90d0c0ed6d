"""Deployment-wide admission: the shared checks of every controller decided in Redis.

`RedisCoordinator` is one process's link to the shared state; passed to
`AdmissionRegistry(controller_factory=coordinator.controller)`, it makes every workspace's
controller a `CoordinatedController`, whose limits hold for all processes together. This package
imports neither Django, DRF nor Celery.
"""

from admission.coordination.controller import (
    COORDINATION_UNAVAILABLE,
    CoordinatedController,
    CoordinatedLease,
)
from admission.coordination.coordinator import RedisCoordinator
from admission.coordination.protocol import CoordinationUnavailable
from admission.coordination.settings import DEGRADED, FAIL_CLOSED, CoordinationSettings

__all__ = [
    "COORDINATION_UNAVAILABLE",
    "DEGRADED",
    "FAIL_CLOSED",
    "CoordinatedController",
    "CoordinatedLease",
    "CoordinationSettings",
    "CoordinationUnavailable",
    "RedisCoordinator",
]
