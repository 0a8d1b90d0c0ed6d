"""The API's only parser: JSON bounded in size and depth before parsing, checked after.

Every API view reads its body through this parser (authentication's CSRF check included), so the
bounds hold whatever reads the body first. The size cap is per endpoint: a view names the setting
that holds its cap in `body_limit_setting`; views that name none take the small action cap
(`SLUICE_MAX_ACTION_REQUEST_BYTES`). No cap exceeds `SLUICE_MAX_REQUEST_BYTES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.parsers import JSONParser

from console.api.untrusted_json import UntrustedJSONError, load_untrusted_json


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"
    default_detail = "The request body is larger than this deployment accepts."


DEFAULT_BODY_LIMIT_SETTING = "SLUICE_MAX_ACTION_REQUEST_BYTES"


def request_too_large(limit: int | None = None) -> RequestTooLarge:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE if limit is None else limit
    return RequestTooLarge(f"The request body is larger than {limit} bytes.")


def body_limit(view: object) -> int:
    """The most bytes `view` reads from a request body."""
    name = getattr(view, "body_limit_setting", DEFAULT_BODY_LIMIT_SETTING)
    return min(int(getattr(settings, name)), int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))


class BoundedJSONParser(JSONParser):
    """JSON of at most the view's body cap and `SLUICE_MAX_JSON_DEPTH` levels.

    Syntax and depth problems are a `parse_error`; a NUL, a lone surrogate or a non-finite
    number is a validation error naming the field that holds it.
    """

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = body_limit((parser_context or {}).get("view"))
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise request_too_large(limit)
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            # str.encode refuses codecs that are not text encodings (bz2_codec and the like).
            "".encode(encoding)
            text = raw.decode(encoding)
        except LookupError:
            raise ParseError(f"Unsupported charset {encoding!r}.") from None
        except UnicodeError:
            raise ParseError(f"The body is not valid {encoding}.") from None
        try:
            return load_untrusted_json(text, max_depth=settings.SLUICE_MAX_JSON_DEPTH)
        except UntrustedJSONError as error:
            if error.path:
                raise ValidationError({error.path: [error.problem]}) from None
            raise ParseError(f"JSON parse error: {error.problem}") from None
