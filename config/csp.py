"""The Content-Security-Policy header on every response.

Scripts come from this origin only (no inline script, no `eval`), so injected markup cannot run
code even where escaping failed; styles may be inline (the admin's and the charts' `style`
attributes), images may be `data:` URLs (the API docs' icons). Pages are never framed, forms
post only here, and plugins are off. `SLUICE_CONTENT_SECURITY_POLICY` replaces the policy.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

__all__ = ["DEFAULT_POLICY", "ContentSecurityPolicyMiddleware"]

DEFAULT_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    """Adds the deployment's policy to each response that does not carry one of its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = settings.SLUICE_CONTENT_SECURITY_POLICY
        if policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = policy
        return response
