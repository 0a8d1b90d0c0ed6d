"""What an error page or error report may show: the traceback's code, never its values.

Django's own filter hides settings whose names look secret and only while DEBUG is off; a
database URL, a variable of the process environment (which runserver copies into the request)
or a local variable holding either would still show. This filter shows none of them, DEBUG or
not.
"""

from __future__ import annotations

from types import FrameType
from typing import Any

from django.http import HttpRequest
from django.views.debug import SafeExceptionReporterFilter

# Request headers that say how the request was made and carry no credential.
_SHOWN_META = frozenset(
    {
        "REQUEST_METHOD",
        "PATH_INFO",
        "QUERY_STRING",
        "CONTENT_TYPE",
        "CONTENT_LENGTH",
        "HTTP_ACCEPT",
        "HTTP_HOST",
        "HTTP_USER_AGENT",
    }
)


class RedactingReporterFilter(SafeExceptionReporterFilter):
    def is_active(self, request: HttpRequest | None) -> bool:
        return True

    def get_safe_settings(self) -> dict[str, Any]:
        return {}

    def get_safe_request_meta(self, request: HttpRequest) -> dict[str, Any]:
        return {key: value for key, value in request.META.items() if key in _SHOWN_META}

    def get_safe_cookies(self, request: HttpRequest) -> dict[str, Any]:
        return {name: self.cleansed_substitute for name in request.COOKIES}

    def get_post_parameters(self, request: HttpRequest | None) -> Any:
        if request is None:
            return {}
        return {name: self.cleansed_substitute for name in request.POST}

    def get_traceback_frame_variables(
        self, request: HttpRequest | None, tb_frame: FrameType
    ) -> Any:
        return [(name, self.cleansed_substitute) for name in tb_frame.f_locals]
