"""Query filters of the history endpoint: kinds and a time range."""

from __future__ import annotations

import django_filters

from admission.models import ProfileChangeRecord


class ProfileHistoryFilter(django_filters.FilterSet):
    # Repeatable: `?kind=change&kind=rollback` returns both kinds.
    kind = django_filters.MultipleChoiceFilter(
        choices=ProfileChangeRecord.Kind.choices,
        help_text="Only records of these kinds; repeat the parameter for several.",
    )
    # Two named filters, not one range, so a bad bound is reported under its own name.
    at_after = django_filters.IsoDateTimeFilter(
        field_name="at",
        lookup_expr="gte",
        help_text="Only records at or after this ISO 8601 time (e.g. 2025-01-01T00:00:00Z).",
    )
    at_before = django_filters.IsoDateTimeFilter(
        field_name="at",
        lookup_expr="lte",
        help_text="Only records at or before this ISO 8601 time.",
    )

    class Meta:
        model = ProfileChangeRecord
        fields = ("kind", "at_after", "at_before")
