"""Thin API views for evaluation and load runs: trusted identities from the request, never the body.

The principal of an evaluation is the authenticated caller and its workspace the one in the URL,
which the caller must belong to; writes go through `evaluator.services.runs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import django_filters
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from admission import access
from admission import selectors as admission_selectors
from admission.models import ProfileVersion
from console.api.admission.serializers import ErrorSerializer
from console.api.admission.views import WorkspaceScopedMixin
from console.api.evaluator.serializers import (
    EvaluationRunSerializer,
    EvaluationRunSummarySerializer,
    EvaluationSubmitSerializer,
    LoadRunSerializer,
    LoadRunSubmitSerializer,
    WhatIfSubmitSerializer,
)
from console.api.pagination import CheckedCursorPagination
from console.api.parsers import BoundedJSONParser
from evaluator import selectors
from evaluator.models import EvaluationRun, LoadRun, WorkerRun
from evaluator.services import cancellation, load_runs
from evaluator.services import runs as services

WORKSPACE_KEY = OpenApiParameter(
    "workspace_key", OpenApiTypes.STR, OpenApiParameter.PATH, description="The workspace's key."
)
RUN_ID = OpenApiParameter("run_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such workspace or run visible to you.")
INVALID = OpenApiResponse(ErrorSerializer, description="Invalid request; `fields` names the field.")
BROKER_DOWN = OpenApiResponse(
    ErrorSerializer,
    description="`broker-unavailable`: the task broker refused the run; it is marked failed.",
)


THROTTLED = OpenApiResponse(
    ErrorSerializer,
    description="`throttled`: this caller submitted too many runs; the `Retry-After` header "
    "says after how many seconds to try again.",
)
RETRY_AFTER = OpenApiParameter(
    "Retry-After",
    OpenApiTypes.INT,
    OpenApiParameter.HEADER,
    description="Seconds until the caller's submission budget allows another run.",
    response=[429],
)


class RunPagination(CheckedCursorPagination):
    ordering = ("-created_at", "-id")


class EvaluationRunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=EvaluationRun.Status.choices, help_text="Only runs in this state."
    )

    class Meta:
        model = EvaluationRun
        fields = ("status",)


@extend_schema(tags=["evaluations"], parameters=[WORKSPACE_KEY])
class EvaluationRunListView(WorkspaceScopedMixin, generics.ListAPIView):
    """The workspace's evaluation runs, newest first; POST submits one for the caller."""

    serializer_class = EvaluationRunSummarySerializer
    pagination_class = RunPagination
    filterset_class = EvaluationRunFilter
    write_act = access.EVALUATE
    starts_runs = True
    # The request document is nested JSON: a form or multipart body cannot carry it.
    parser_classes = [BoundedJSONParser]
    body_limit_setting = "SLUICE_MAX_EVALUATION_REQUEST_BYTES"

    def get_queryset(self) -> QuerySet[EvaluationRun]:
        if getattr(self, "swagger_fake_view", False):
            return EvaluationRun.objects.none()
        return selectors.evaluation_run_list(workspace=self.get_workspace())

    @extend_schema(responses={200: EvaluationRunSummarySerializer(many=True), 404: NOT_FOUND})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=EvaluationSubmitSerializer,
        parameters=[RETRY_AFTER],
        responses={
            201: EvaluationRunSerializer,
            200: OpenApiResponse(
                EvaluationRunSerializer, description="The same invocationId was submitted before."
            ),
            400: INVALID,
            404: NOT_FOUND,
            429: THROTTLED,
            503: BROKER_DOWN,
        },
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        run, created = services.evaluation_run_submit(
            self.get_workspace(), request.user, request.data
        )
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(EvaluationRunSerializer(run).data, status=code)


@extend_schema(
    tags=["evaluations"],
    parameters=[WORKSPACE_KEY, RUN_ID],
    responses={200: EvaluationRunSerializer, 404: NOT_FOUND},
)
class EvaluationRunDetailView(WorkspaceScopedMixin, generics.GenericAPIView):
    """One evaluation run: its status and progress, its attempts so far with their admission
    evidence and, once finished, its result."""

    serializer_class = EvaluationRunSerializer
    filter_backends: list[Any] = []

    def get(self, request: Request, workspace_key: str, run_id: str) -> Response:
        run = selectors.evaluation_run_get(workspace=self.get_workspace(), run_id=run_id)
        if run is None:
            raise NotFound("No such evaluation run.")
        return Response(self.get_serializer(run).data)


def _cancel_schema(
    tag: str, serializer: type[Any], *, queued: str, running: str, forbidden: str
) -> Callable[[Any], Any]:
    """The OpenAPI description of a kind's cancel endpoint: what 200, 202 and 403 mean for it."""
    return extend_schema(
        tags=[tag],
        parameters=[WORKSPACE_KEY, RUN_ID],
        request=None,
        responses={
            200: OpenApiResponse(serializer, description=queued),
            202: OpenApiResponse(serializer, description=running),
            403: OpenApiResponse(ErrorSerializer, description=forbidden),
            404: NOT_FOUND,
            409: OpenApiResponse(
                ErrorSerializer, description="`run-finished`: the run already ended."
            ),
        },
    )


class RunCancelView(WorkspaceScopedMixin, generics.GenericAPIView):
    """Cancel a queued or running run of one kind: 200 with the run cancelled when it was
    queued, 202 with the cancel requested while its worker stops it. Each kind names how a run
    of the workspace is found and the service that cancels it."""

    filter_backends: list[Any] = []
    kind = "run"
    find: Callable[..., WorkerRun | None]
    cancel: Callable[[Any, Any], WorkerRun]

    def post(self, request: Request, workspace_key: str, run_id: str) -> Response:
        run = self.find(workspace=self.get_workspace(), run_id=run_id)
        if run is None:
            raise NotFound(f"No such {self.kind}.")
        run = self.cancel(run, request.user)
        code = status.HTTP_200_OK if run.finished else status.HTTP_202_ACCEPTED
        return Response(self.get_serializer(run).data, status=code)


@_cancel_schema(
    "evaluations",
    EvaluationRunSerializer,
    queued="The run was queued: it is now cancelled.",
    running="The run is running: the cancel is requested, and the worker ends the run "
    "`cancelled` within about a second (`cancelRequestedAt` is set).",
    forbidden="Members cancel their own runs; operators anybody's.",
)
class EvaluationRunCancelView(RunCancelView):
    """Cancel a queued or running evaluation run."""

    serializer_class = EvaluationRunSerializer
    write_act = access.EVALUATE
    kind = "evaluation run"
    find = staticmethod(selectors.evaluation_run_get)
    cancel = staticmethod(cancellation.evaluation_run_cancel)


@extend_schema(tags=["load runs"], parameters=[WORKSPACE_KEY])
class LoadRunListView(WorkspaceScopedMixin, generics.ListAPIView):
    """Load harness runs of the workspace; POST starts one (operators)."""

    serializer_class = LoadRunSerializer
    pagination_class = RunPagination
    filter_backends: list[Any] = []
    write_act = access.RUN_LOAD
    starts_runs = True

    def get_queryset(self) -> QuerySet[LoadRun]:
        if getattr(self, "swagger_fake_view", False):
            return LoadRun.objects.none()
        return selectors.load_run_list(workspace=self.get_workspace())

    @extend_schema(
        responses={200: LoadRunSerializer(many=True), 403: ErrorSerializer, 404: NOT_FOUND}
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=LoadRunSubmitSerializer,
        parameters=[RETRY_AFTER],
        responses={
            201: OpenApiResponse(
                LoadRunSerializer,
                description="Queued: a worker claims it fairly across workspaces, at most "
                "SLUICE_WORKSPACE_LOAD_RUNS_IN_FLIGHT of this workspace at once.",
            ),
            400: INVALID,
            403: ErrorSerializer,
            404: NOT_FOUND,
            429: OpenApiResponse(
                ErrorSerializer,
                description="`throttled`: this caller submitted too many runs, or the workspace "
                "already has SLUICE_WORKSPACE_LOAD_RUNS_QUEUED load runs waiting.",
            ),
        },
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = LoadRunSubmitSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        run = services.load_run_submit(
            self.get_workspace(),
            request.user,
            payload.validated_data["manifest"],
            payload.validated_data["target"],
        )
        return Response(LoadRunSerializer(run).data, status=status.HTTP_201_CREATED)


@extend_schema(
    tags=["load runs"],
    parameters=[WORKSPACE_KEY, RUN_ID],
    responses={200: LoadRunSerializer, 403: ErrorSerializer, 404: NOT_FOUND},
)
class LoadRunDetailView(WorkspaceScopedMixin, generics.GenericAPIView):
    """One load run with its decision-load-result/v1 record once it finished."""

    serializer_class = LoadRunSerializer
    filter_backends: list[Any] = []

    def get(self, request: Request, workspace_key: str, run_id: str) -> Response:
        run = selectors.load_run_get(workspace=self.get_workspace(), run_id=run_id)
        if run is None:
            raise NotFound("No such load run.")
        return Response(self.get_serializer(run).data)


@_cancel_schema(
    "load runs",
    LoadRunSerializer,
    queued="The load run was queued: it is now cancelled.",
    running="The load run is running: the cancel is requested (`cancelRequestedAt` is set) and "
    "the worker running it ends it `cancelled` at its next progress report, within about a "
    "second.",
    forbidden="Operators cancel load runs; proposers their own what-if runs.",
)
class LoadRunCancelView(RunCancelView):
    """Cancel a queued or running load run (what-if runs included)."""

    serializer_class = LoadRunSerializer
    # Proposers cancel their own what-if runs; the service decides per run.
    write_act = access.PROPOSE
    kind = "load run"
    find = staticmethod(selectors.load_run_get)
    cancel = staticmethod(load_runs.load_run_cancel)


PROFILE_VERSION = OpenApiParameter(
    "profile_version", OpenApiTypes.STR, OpenApiParameter.PATH, description="The version's label."
)
_WHAT_IF_EXAMPLE_RUN = {
    "id": "1f0c6b6e-5d0e-4a43-9d8e-3b1c1c0f7a21",
    "workspaceId": "acme",
    "submittedBy": "lena",
    "manifest": "load-manifest.v2.json",
    "target": "admission-controller",
    "status": "completed",
    "progress": 1.0,
    "manifestDigest": "sha256:416a4146…28a0c",
    "passed": False,
    "deliveries": 1,
    "taskId": "8f8e0b3a-3c55-4d4b-b1f5-0d8cbb1c5f61",
    "createdAt": "2026-12-01T09:00:00Z",
    "startedAt": "2026-12-01T09:00:01Z",
    "finishedAt": "2026-12-01T09:00:03Z",
    "cancelRequestedAt": None,
    "cancelRequestedBy": None,
    "error": None,
    "whatIfVersion": "v3",
    "mapping": None,
    "verdict": {
        "passed": False,
        "failed": ["minimumQuietPrincipalAdmissionRatio"],
        "bounds": [
            {"bound": "maxQueueDelayMs", "observed": 812.0, "limit": 2000, "passed": True},
            {
                "bound": "minimumQuietPrincipalAdmissionRatio",
                "observed": 0.61,
                "limit": 0.95,
                "passed": False,
            },
        ],
    },
    "record": {"schema": "decision-load-result/v1", "mode": "what-if", "passed": False},
}


@extend_schema(tags=["what-if"], parameters=[WORKSPACE_KEY, PROFILE_VERSION])
class WhatIfRunListView(WorkspaceScopedMixin, generics.ListAPIView):
    """What-if runs of one profile version, newest first; POST starts one (proposers and
    above). A what-if run is a load run: queued, claimed fairly and cancelled like one, its
    record and verdict read here or at `…/load-runs/{id}/`."""

    serializer_class = LoadRunSerializer
    pagination_class = RunPagination
    filter_backends: list[Any] = []
    write_act = access.PROPOSE
    starts_runs = True
    parser_classes = [BoundedJSONParser]

    def get_version(self) -> ProfileVersion:
        version = admission_selectors.profile_version_get(
            workspace=self.get_workspace(), label=self.kwargs["profile_version"]
        )
        if version is None:
            raise NotFound("No such profile version.")
        return version

    def get_queryset(self) -> QuerySet[LoadRun]:
        if getattr(self, "swagger_fake_view", False):
            return LoadRun.objects.none()
        return selectors.what_if_run_list(version=self.get_version())

    @extend_schema(responses={200: LoadRunSerializer(many=True), 404: NOT_FOUND})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        request=WhatIfSubmitSerializer,
        parameters=[RETRY_AFTER],
        examples=[
            OpenApiExample(
                "v2 manifest on the controller path",
                value={"manifest": "load-manifest.v2.json", "target": "admission-controller"},
                request_only=True,
            ),
            OpenApiExample(
                "with an id mapping",
                value={
                    "target": "evaluator",
                    "mapping": {"principals": {"noisy": "batch"}, "providers": {"jev": "llm"}},
                },
                request_only=True,
            ),
            OpenApiExample(
                "a completed run (when read back)",
                value=_WHAT_IF_EXAMPLE_RUN,
                response_only=True,
                status_codes=["201"],
            ),
        ],
        responses={
            201: OpenApiResponse(
                LoadRunSerializer,
                description="Queued; read it back here or at `…/load-runs/{id}/` for its "
                "progress, then its record and verdict.",
            ),
            400: INVALID,
            403: OpenApiResponse(
                ErrorSerializer, description="Proposers and above start what-if runs."
            ),
            404: NOT_FOUND,
            429: OpenApiResponse(
                ErrorSerializer,
                description="`throttled`: too many runs submitted, or the workspace's load-run "
                "backlog is full.",
            ),
        },
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        version = self.get_version()
        payload = WhatIfSubmitSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        run = services.load_run_submit(
            self.get_workspace(),
            request.user,
            data["manifest"],
            data["target"],
            what_if_version=version,
            mapping=data["mapping"],
        )
        return Response(LoadRunSerializer(run).data, status=status.HTTP_201_CREATED)
