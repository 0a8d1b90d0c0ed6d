"""The evaluator services' refusals: `ServiceError`s (admission.core), each with a `code` the
interfaces report and the `field` at fault when there is one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from admission.core import ServiceError

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


class RunServiceError(ServiceError):
    """A run could not be submitted, cancelled or ended as asked; `field` names the input at
    fault when there is one."""


class InvalidRunRequest(RunServiceError):
    """The request document, manifest or target cannot run; nothing was written."""


class LoadRunNotAllowed(RunServiceError):
    """Only operators of the workspace start load runs (`admission.access`)."""

    code = "permission_denied"


class BrokerUnavailable(RunServiceError):
    """The broker did not take the task; the run row says `failed` / `broker-unavailable`."""

    code = BROKER_UNAVAILABLE

    def __init__(self, message: str, *, run: EvaluationRun | LoadRun) -> None:
        super().__init__(message)
        self.run = run


class LoadRunBacklogFull(RunServiceError):
    """The workspace already has `SLUICE_WORKSPACE_LOAD_RUNS_QUEUED` load runs waiting."""

    code = "throttled"
