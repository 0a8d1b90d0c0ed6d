"""API throttles: per user, per workspace, and a stricter scope for starting runs.

Rates come from `settings.SLUICE_THROTTLE_RATES` (read when each request is throttled, so a
changed setting applies at once); counters live in the default cache, which is Redis whenever
the deployment has one, so every web process counts against the same budget. A refusal is a 429
with `Retry-After` and the API's typed error body.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import AnonRateThrottle, SimpleRateThrottle, UserRateThrottle


class _ConfiguredRate:
    scope: str

    def get_rate(self) -> str | None:
        return settings.SLUICE_THROTTLE_RATES.get(self.scope)


class AnonymousThrottle(_ConfiguredRate, AnonRateThrottle):
    """Unauthenticated requests, per client address."""

    scope = "anon"


class UserThrottle(_ConfiguredRate, UserRateThrottle):
    """Every authenticated request, per user."""

    scope = "user"


class WorkspaceThrottle(_ConfiguredRate, SimpleRateThrottle):
    """Every request to one workspace, whoever makes it.

    Counted only once the caller was allowed to see the workspace, so nobody can spend another
    tenant's budget by knocking on its URLs.
    """

    scope = "workspace"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        workspace = getattr(view, "resolved_workspace", None)
        if workspace is None:
            return None
        return self.cache_format % {"scope": self.scope, "ident": workspace.pk}


class SubmissionThrottle(_ConfiguredRate, UserRateThrottle):
    """POSTs that start work (views with `starts_runs = True`), per user: the strictest."""

    scope = "submit"

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.method != "POST" or not getattr(view, "starts_runs", False):
            return True
        return super().allow_request(request, view)
