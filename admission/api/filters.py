"""Query filters of the history endpoint: kind and a time range."""

from __future__ import annotations

import django_filters

from admission.models import ProfileChangeRecord


class ProfileHistoryFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(
        choices=ProfileChangeRecord.Kind.choices, help_text="Only records of this kind."
    )
    at = django_filters.IsoDateTimeFromToRangeFilter(
        help_text="`at_after` / `at_before`: ISO 8601 bounds on the record's time, inclusive."
    )

    class Meta:
        model = ProfileChangeRecord
        fields = ("kind", "at")
