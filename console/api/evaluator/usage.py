"""Usage over time through the API: `GET /api/workspaces/{key}/usage/` (sums, decisions by
reason and the hourly, or for ranges over two days daily, series of a time range) and
`GET /api/workspaces/{key}/usage.csv` (every hourly row, for a spreadsheet). Any member of
the workspace may read them; principal ids appear only here, inside the workspace's own
access-controlled routes."""

from __future__ import annotations

from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.admission.serializers import ErrorSerializer
from console.api.admission.views import WorkspaceScopedMixin
from evaluator.services import usage

WORKSPACE_KEY = OpenApiParameter(
    "workspace_key", OpenApiTypes.STR, OpenApiParameter.PATH, description="The workspace's key."
)
RANGE_PARAMETERS = [
    OpenApiParameter(
        "range",
        OpenApiTypes.STR,
        enum=list(usage.RANGES),
        description="A range ending with the current hour (default 24h); ignored when `start` "
        "or `end` is given.",
    ),
    OpenApiParameter(
        "start", OpenApiTypes.STR, description="First hour: a date (YYYY-MM-DD) or ISO 8601 time."
    ),
    OpenApiParameter(
        "end",
        OpenApiTypes.STR,
        description="End of the range (exclusive): an ISO 8601 time, or a date for the whole day.",
    ),
    OpenApiParameter("provider", OpenApiTypes.STR, description="Only this provider."),
    OpenApiParameter("principal", OpenApiTypes.STR, description="Only this principal."),
]
INVALID = OpenApiResponse(ErrorSerializer, description="A bad range; `fields` names the parameter.")
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such workspace visible to you.")


def _totals(total: usage.UsageTotals) -> dict[str, Any]:
    return {
        "runs": total.runs,
        "calls": total.calls,
        "tokens": total.tokens,
        "costUsd": total.cost_usd,
        "unpricedCalls": total.unpriced_calls,
        "admitted": total.admitted,
        "deferred": total.deferred,
        "refused": total.refused,
        "meanQueueDelayMs": total.mean_queue_delay_ms,
        "maxQueueDelayMs": total.queue_delay_ms_max,
    }


class _UsageRange(WorkspaceScopedMixin, generics.GenericAPIView):
    filter_backends: list[Any] = []

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # A CSV client may accept only text/csv: answer it all the same (errors as JSON).
        return super().perform_content_negotiation(request, force=True)

    def rows(self, request: Request, *, hourly: bool = False) -> tuple[Any, Any, Any]:
        start, end, _ = usage.usage_range_from(request.query_params)
        select = usage.usage_hours if hourly else usage.usage_rows
        rows = select(
            self.get_workspace(),
            start,
            end,
            provider=request.query_params.get("provider") or None,
            principal=request.query_params.get("principal") or None,
        )
        return rows, start, end


@extend_schema(
    tags=["usage"],
    parameters=[WORKSPACE_KEY, *RANGE_PARAMETERS],
    responses={200: OpenApiTypes.OBJECT, 400: INVALID, 404: NOT_FOUND},
)
class UsageView(_UsageRange):
    """Calls, actual tokens and cost, admitted, deferred (waited in the admission queue,
    admitted or not) and refused attempts and queue delay over a time range: in total, per
    provider, per principal, the deferrals and refusals by reason (an attempt deferred for two
    reasons counts under both), and period by period: `hours` (every hour of the range, empty
    ones as zeros) for ranges up to two days, else `days` (every UTC day the range touches);
    `granularity` says which."""

    def get(self, request: Request, workspace_key: str) -> Response:
        rows, start, end = self.rows(request)
        series = usage.usage_series(rows, start, end)
        providers = usage.usage_totals(rows, "provider_id")
        whole = usage.usage_totals_summed(providers)
        unit = series["granularity"]
        return Response(
            {
                "workspace": self.get_workspace().key,
                "start": start,
                "end": end,
                "granularity": unit,
                "totals": _totals(whole) if whole is not None else None,
                "deferredByReason": series["deferred_by_reason"],
                "refusedByReason": series["refused_by_reason"],
                "providers": {t.key: _totals(t) for t in providers},
                "principals": {t.key: _totals(t) for t in usage.usage_totals(rows, "principal_id")},
                f"{unit}s": [
                    {
                        unit: p["start"],
                        "calls": p["calls"],
                        "tokens": p["tokens"],
                        "costUsd": p["cost_usd"],
                        "admitted": p["admitted"],
                        "deferred": p["deferred"],
                        "refused": p["refused"],
                        "meanQueueDelayMs": p["mean_queue_delay_ms"],
                    }
                    for p in series["points"]
                ],
            }
        )


@extend_schema(
    tags=["usage"],
    parameters=[WORKSPACE_KEY, *RANGE_PARAMETERS],
    responses={
        (200, "text/csv"): OpenApiResponse(
            OpenApiTypes.STR,
            description="One line per hour, provider and principal: "
            + ", ".join(usage.CSV_COLUMNS),
        ),
        400: INVALID,
        404: NOT_FOUND,
    },
)
class UsageCsvView(_UsageRange):
    """Every hourly row of the range as CSV, full precision, streamed."""

    def get(self, request: Request, workspace_key: str) -> StreamingHttpResponse:
        rows, start, end = self.rows(request, hourly=True)
        response = StreamingHttpResponse(usage.usage_csv(rows), content_type="text/csv")
        name = f"sluice-usage-{workspace_key}-{start:%Y%m%dT%H}-{end:%Y%m%dT%H}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
