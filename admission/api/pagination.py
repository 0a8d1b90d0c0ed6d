"""Cursor pagination with a unique ordering, so pages never skip or repeat a row."""

from __future__ import annotations

from rest_framework.pagination import CursorPagination


class ProfileHistoryPagination(CursorPagination):
    ordering = ("-at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class ProfileVersionPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
