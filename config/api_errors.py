"""One error shape for the REST API: `{"error": {"type", "detail", "fields"}}` plus DRF's fields."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Django's own exceptions get the code of the DRF exception they stand for.
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
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
