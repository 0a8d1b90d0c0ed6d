"""Query filters of the history endpoint: kind and a time range."""

from __future__ import annotations

import datetime as dt
from typing import Any

import django_filters
from django import forms
from django_filters.fields import IsoDateTimeRangeField

from admission.models import ProfileChangeRecord


class UtcIsoDateTimeRangeField(IsoDateTimeRangeField):
    """ISO 8601 bounds, moved to UTC before they reach the database: ISO allows offsets up to
    ±23:59, PostgreSQL only ±15:59, and a bound UTC cannot hold is a 400, not a 500."""

    def compress(self, data_list: Any) -> slice | None:
        bounds = super().compress(data_list)
        if bounds is None:
            return None
        try:
            start, stop = (
                None if value is None else value.astimezone(dt.UTC)
                for value in (bounds.start, bounds.stop)
            )
        except OverflowError:
            raise forms.ValidationError("a bound lies outside the years UTC can hold") from None
        return slice(start, stop)


class UtcIsoDateTimeFromToRangeFilter(django_filters.IsoDateTimeFromToRangeFilter):
    field_class = UtcIsoDateTimeRangeField


class ProfileHistoryFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(
        choices=ProfileChangeRecord.Kind.choices, help_text="Only records of this kind."
    )
    at = UtcIsoDateTimeFromToRangeFilter(
        help_text="`at_after` / `at_before`: ISO 8601 bounds on the record's time, inclusive."
    )

    class Meta:
        model = ProfileChangeRecord
        fields = ("kind", "at")
