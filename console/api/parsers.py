"""The API's only parser: JSON bounded in size and depth before parsing, checked after."""

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


def request_too_large() -> RequestTooLarge:
    return RequestTooLarge(
        f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."
    )


class BoundedJSONParser(JSONParser):
    """JSON of at most `DATA_UPLOAD_MAX_MEMORY_SIZE` bytes and `SLUICE_MAX_JSON_DEPTH` levels.

    Syntax and depth problems are a `parse_error`; a NUL, a lone surrogate or a non-finite
    number is a validation error naming the field that holds it.
    """

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise request_too_large()
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
