"""Query filters of the history endpoint: kinds and a time range."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeField

from admission.models import ProfileChangeRecord


class UtcIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 time, moved to UTC before it reaches the database: ISO allows offsets up to
    ±23:59, PostgreSQL only ±15:59, and a time UTC cannot hold is a 400, not a 500."""

    def to_python(self, value: Any) -> dt.datetime | None:
        moment = super().to_python(value)
        if moment is None:
            return None
        try:
            return moment.astimezone(dt.UTC)
        except OverflowError:
            raise forms.ValidationError("lies outside the years UTC can hold") from None


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class ProfileHistoryFilter(django_filters.FilterSet):
    # Repeatable: `?kind=change&kind=rollback` returns both kinds.
    kind = django_filters.MultipleChoiceFilter(
        choices=ProfileChangeRecord.Kind.choices,
        help_text="Only records of these kinds; repeat the parameter for several.",
    )
    # Two named filters, not one range, so a bad bound is reported under its own name.
    at_after = UtcIsoDateTimeFilter(
        field_name="at",
        lookup_expr="gte",
        help_text="Only records at or after this ISO 8601 time (e.g. 2025-01-01T00:00:00Z).",
    )
    at_before = UtcIsoDateTimeFilter(
        field_name="at",
        lookup_expr="lte",
        help_text="Only records at or before this ISO 8601 time.",
    )

    class Meta:
        model = ProfileChangeRecord
        fields = ("kind", "at_after", "at_before")
