"""JSON Schemas (draft 2020-12) of the two documents operators write: a profile version and an
evaluation request. The files live beside the code that parses each document; the API serves
them read-only, without authentication, like the OpenAPI schema."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.views import APIView

__all__ = [
    "DOCUMENT_SCHEMAS",
    "DocumentSchemaView",
    "EvaluationSchemaView",
    "ProfileSchemaView",
    "document_schema",
]

DOCUMENT_SCHEMAS: dict[str, str] = {
    "profile": "admission/schemas/profile.schema.json",
    "evaluation": "evaluator/schemas/evaluation.schema.json",
}
MEDIA_TYPE = "application/schema+json"


@cache
def document_schema(name: str) -> dict[str, Any]:
    """The schema of document ``name`` (``profile`` or ``evaluation``)."""
    path = Path(settings.BASE_DIR) / DOCUMENT_SCHEMAS[name]
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


class DocumentSchemaView(APIView):
    """One document's JSON Schema; `document` is set per route."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []
    document = ""

    def get(self, request: Request) -> HttpResponse:
        # The schema whatever the Accept header says: it is a file, not a negotiated resource.
        body = json.dumps(document_schema(self.document), indent=2, ensure_ascii=False)
        return HttpResponse(body, content_type=MEDIA_TYPE)


def _documented(document: str, what: str) -> Any:
    return extend_schema(
        operation_id=f"{document}_schema",
        tags=["schemas"],
        summary=f"JSON Schema of the {what}",
        description=(
            f"The draft 2020-12 JSON Schema of the {what}, with what the server checks beyond "
            "it in its description. docs/documents.md shows examples."
        ),
        responses={(200, MEDIA_TYPE): OpenApiResponse(OpenApiTypes.OBJECT)},
    )


class ProfileSchemaView(DocumentSchemaView):
    document = "profile"

    @_documented("profile", "profile document (POST …/profiles/)")
    def get(self, request: Request) -> HttpResponse:
        return super().get(request)


class EvaluationSchemaView(DocumentSchemaView):
    document = "evaluation"

    @_documented("evaluation", "evaluation request (POST …/evaluations/)")
    def get(self, request: Request) -> HttpResponse:
        return super().get(request)
