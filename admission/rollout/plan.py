"""What a run that starts now runs under: the kill switch, the shadow and the canary arm.

`admission.services.rollout.run_plan` decides a plan once per run and keeps it on the run's
boundary row; the process registry and the worker only read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from admission.models import RolloutEvent

__all__ = ["RunPlan", "version_label"]


@dataclass(frozen=True, slots=True)
class RunPlan:
    """What a run that starts now runs under: decided once, at the run boundary."""

    workspace_key: str
    parallel_allowed: bool
    shadow: RolloutEvent | None
    # The running canary, and whether this run is one of its runs.
    canary: RolloutEvent | None
    on_canary: bool = False

    def scheduler_enabled(self, requested: bool) -> bool:
        return requested and self.parallel_allowed

    def describe(self, *, requested: bool) -> dict[str, Any]:
        """The run's `rollout` entry: the switch, the effective scheduler setting, the arms."""
        return {
            "parallelScheduling": "allowed" if self.parallel_allowed else "off",
            "schedulerEnabled": self.scheduler_enabled(requested),
            "schedulerRequested": requested,
            "canary": version_label(self.canary) if self.on_canary else None,
            "shadow": version_label(self.shadow) if not self.on_canary else None,
        }


def version_label(event: RolloutEvent | None) -> str | None:
    if event is None or event.version is None:
        return None
    return event.version.profile_version
