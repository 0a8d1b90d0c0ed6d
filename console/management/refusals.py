"""How a management command reports a service's refusal: one `CommandError` in the service's
words, naming the field at fault (every problem of a document, one a line); a missing
permission names the user it was asked for."""

from __future__ import annotations

from django.core.management.base import CommandError

from admission import access
from admission.core import ServiceError

__all__ = ["REFUSALS", "command_error"]

# What a command catches around a service call and reports as its error.
REFUSALS = (ServiceError, access.AccessDenied)


def command_error(error: Exception, *, user: str = "") -> CommandError:
    if isinstance(error, access.AccessDenied):
        return CommandError(f"{user}: {error}" if user else str(error))
    if isinstance(error, ServiceError):
        reasons = error.reasons()
        return CommandError(error.summary() if len(reasons) == 1 else "\n".join(reasons))
    return CommandError(str(error))
