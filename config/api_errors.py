"""One error shape for the REST API: `{"error": {"type", "detail", "fields"}}` plus DRF's fields."""

from __future__ import annotations

from typing import Any

from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
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
