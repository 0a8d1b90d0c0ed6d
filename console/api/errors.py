"""One error shape for the REST API: `{"error": {"type", "detail", "fields"}}` plus DRF's fields.

A service's refusal (`admission.core.ServiceError`, raised by the admission and evaluator
services) is translated here and nowhere else: `invalid` answers 400 naming the field at fault
(`fields`), the other codes answer the status of `REFUSAL_STATUS` with the code as the type.

DRF's views answer through `exception_handler`; what happens outside them (a URL under /api/
that matches no route, a server error, a body Django refused before a view ran) goes through
the `handler*` views of `config.urls`, which answer the same shape under /api/ and Django's
plain pages elsewhere.

A database that cannot be reached (refused, restarting, gone) is not a server error: the API
answers `503` with `{"error": {"type": "database-unavailable"}}` and `Retry-After`, and other
pages a plain 503, whether the failure happened in a view or in a middleware before it.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from admission.core import ServiceError
from console.api.parsers import request_too_large

API_PREFIX = "/api/"
DATABASE_UNAVAILABLE = "database-unavailable"
DATABASE_RETRY_AFTER_SECONDS = 5
_DATABASE_DOWN = (OperationalError, InterfaceError)
_DATABASE_DETAIL = "The database is not reachable right now; nothing was changed. Retry shortly."


# The status each refusal code answers; an `invalid` refusal answers 400 with its field.
REFUSAL_STATUS = {
    "four_eyes": 403,
    "permission_denied": 403,
    "conflict": 409,
    "run-finished": 409,
    "throttled": 429,
    "broker-unavailable": 503,
}


class Refused(exceptions.APIException):
    """A service's refusal other than `invalid`: its code is the answer's type."""

    def __init__(self, error: ServiceError) -> None:
        self.status_code = REFUSAL_STATUS.get(error.code, 400)
        self.default_code = error.code
        super().__init__(detail=str(error), code=error.code)


def refusal(error: ServiceError, view: Any = None) -> exceptions.APIException:
    """The API's answer to a service's refusal. A view whose every refusal is about one input
    names it in `refusal_field` (the profile list's POST: its `document`)."""
    field = getattr(view, "refusal_field", None)
    if field is None and error.code == "invalid":
        field = error.document or error.field or "non_field_errors"
    if field is not None:
        return exceptions.ValidationError({field: error.reasons()})
    return Refused(error)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ServiceError):
        exc = refusal(exc, context.get("view"))
    # Django's own exceptions get the code of the DRF exception they stand for.
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, RequestDataTooBig):
        exc = request_too_large()
    elif isinstance(exc, _DATABASE_DOWN):
        return Response(
            {"error": {"type": DATABASE_UNAVAILABLE, "detail": _DATABASE_DETAIL}},
            status=503,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", "error")
    data = response.data
    if isinstance(data, dict) and set(data) == {"detail"}:
        response.data = {"error": {"type": str(code), "detail": data["detail"]}}
    else:
        response.data = {"error": {"type": str(code), "fields": data}}
    return response


def _typed(status: int, error_type: str, detail: str) -> JsonResponse:
    return JsonResponse({"error": {"type": error_type, "detail": detail}}, status=status)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if isinstance(exception, RequestDataTooBig):
        too_large = request_too_large()
        if _is_api(request):
            return _typed(too_large.status_code, "request_too_large", str(too_large.detail))
        return HttpResponse(str(too_large.detail), status=too_large.status_code)
    if _is_api(request):
        return _typed(400, "bad_request", "The request could not be understood.")
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return _typed(403, "permission_denied", "You do not have permission to do this.")
    return defaults.permission_denied(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return _typed(404, "not_found", "Not found.")
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if isinstance(sys.exc_info()[1], _DATABASE_DOWN):
        if _is_api(request):
            response: HttpResponse = _typed(503, DATABASE_UNAVAILABLE, _DATABASE_DETAIL)
        else:
            response = HttpResponse(_DATABASE_DETAIL, status=503, content_type="text/plain")
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response
    if _is_api(request):
        return _typed(500, "server_error", "The server failed to answer; it has been logged.")
    return defaults.server_error(request)
