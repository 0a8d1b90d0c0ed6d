"""The evaluator services' refusals: one family, each with a `type` the interfaces report and
the `field` at fault when there is one."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evaluator.models import EvaluationRun, LoadRun

__all__ = [
    "BROKER_UNAVAILABLE",
    "BrokerUnavailable",
    "InvalidRunRequest",
    "LoadRunBacklogFull",
    "LoadRunNotAllowed",
    "RunServiceError",
]

BROKER_UNAVAILABLE = "broker-unavailable"


class RunServiceError(Exception):
    """A run could not be submitted; `field` names the input at fault when there is one."""

    type = "invalid"
    field: str | None = None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        if field is not None:
            self.field = field


class InvalidRunRequest(RunServiceError):
    """The request document, manifest or target cannot run; nothing was written."""


class LoadRunNotAllowed(RunServiceError):
    """Only operators of the workspace start load runs (`admission.access`)."""

    type = "permission_denied"


class BrokerUnavailable(RunServiceError):
    """The broker did not take the task; the run row says `failed` / `broker-unavailable`."""

    type = BROKER_UNAVAILABLE

    def __init__(self, message: str, *, run: EvaluationRun | LoadRun) -> None:
        super().__init__(message)
        self.run = run


class LoadRunBacklogFull(RunServiceError):
    """The workspace already has `SLUICE_WORKSPACE_LOAD_RUNS_QUEUED` load runs waiting."""

    type = "throttled"
