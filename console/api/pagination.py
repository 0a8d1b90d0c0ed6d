"""Cursor pagination with a unique ordering, so pages never skip or repeat a row."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Field, Model
from rest_framework.exceptions import NotFound
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request


class CheckedCursorPagination(CursorPagination):
    """A cursor whose position is not a value of the ordering field is a 404, like any other
    tampered cursor, instead of reaching the database as a filter it cannot apply."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    _model: type[Model] | None = None

    def paginate_queryset(self, queryset: Any, request: Request, view: Any = None) -> Any:
        self._model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Request) -> Cursor | None:
        cursor = super().decode_cursor(request)
        if cursor is None or cursor.position is None or self._model is None:
            return cursor
        field = self._model._meta.get_field(str(self.ordering[0]).lstrip("-"))
        position = str(cursor.position)
        try:
            if "\x00" in position or not isinstance(field, Field):
                raise ValidationError("not a value of the ordering field")
            field.to_python(position)
        except (ValidationError, ValueError, TypeError, OverflowError):
            raise NotFound(self.invalid_cursor_message) from None
        return cursor


class ProfileHistoryPagination(CheckedCursorPagination):
    ordering = ("-at", "-id")


class ProfileVersionPagination(CheckedCursorPagination):
    ordering = ("-created_at", "-id")
    # Each version carries its whole document (up to SLUICE_MAX_PROFILE_BYTES): a page of at
    # most 20 stays a few megabytes whatever `page_size` asks for.
    page_size = 20
    max_page_size = 20


class NewestIdFirstPagination(CheckedCursorPagination):
    ordering = ("-id",)
