"""The profile workflow over REST: decide, activate, roll back, and the rollout controls (kill
switch, shadow, canary), with the admin's rules.

Every write calls the service the admin calls, so roles (`admission.access`), four-eyes rules and
refusals are the same. A refusal answers with the error shape of `console.api.errors`:
400 `invalid` (with the field at fault), 403 `four_eyes` or `permission_denied`, 409 `conflict`
when the workspace's state does not allow it now.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
)
from rest_framework import generics, serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from admission import access, selectors
from admission.core.labels import label_problem
from admission.models import ProfileVersion, RollbackRequest, RolloutEvent
from admission.services import profiles as services
from admission.services import rollout
from console.api.admission.serializers import (
    ErrorSerializer,
    ProfileChangeRecordSerializer,
    ProfileVersionSerializer,
)
from console.api.admission.views import NOT_FOUND, WORKSPACE_KEY, WorkspaceScopedView, request_user
from console.api.pagination import NewestIdFirstPagination
from evaluator import comparisons

PROFILE_VERSION = OpenApiParameter(
    "profile_version", OpenApiTypes.STR, OpenApiParameter.PATH, description="The label."
)
ROLLBACK_ID = OpenApiParameter(
    "rollback_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="The request's id."
)


def _refusals(*extra: int) -> dict[int, OpenApiResponse]:
    described = {
        400: OpenApiResponse(ErrorSerializer, description="Invalid input; names the field."),
        403: OpenApiResponse(
            ErrorSerializer,
            description="Your role does not allow it (`permission_denied`), or you did the "
            "other half of a four-eyes pair (`four_eyes`).",
        ),
        404: NOT_FOUND,
        409: OpenApiResponse(
            ErrorSerializer, description="The workspace's state does not allow it now."
        ),
    }
    return {code: described[code] for code in (400, 403, 404, 409, *extra) if code in described}


# ------------------------------------------------------------------------ serializers


class ChecklistSerializer(serializers.Serializer):
    """The runbook checklist: every item must be true to approve."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            key: serializers.BooleanField(required=False, default=False, help_text=text)
            for key, text in services.RUNBOOK_CHECKLIST
        }


class ApproveSerializer(serializers.Serializer):
    checklist = ChecklistSerializer(help_text="Every item of RUN-JEV-ADMISSION-v1, confirmed.")
    comment = serializers.CharField(required=False, allow_blank=True, default="")


class RejectSerializer(serializers.Serializer):
    comment = serializers.CharField(help_text="Why; required.", allow_blank=True)
    checklist = ChecklistSerializer(required=False)


class CommentSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="")


class RejectCommentSerializer(serializers.Serializer):
    comment = serializers.CharField(help_text="Why; required.", allow_blank=True)


class RollbackCreateSerializer(serializers.Serializer):
    target = serializers.CharField(help_text="The profileVersion to activate again.")
    reason = serializers.CharField(help_text="Why; kept on the ledger.", allow_blank=True)


class RollbackRequestSerializer(serializers.ModelSerializer):
    workspaceId = serializers.CharField(source="workspace.key", read_only=True)
    target = serializers.CharField(source="target.profile_version", read_only=True)
    requestedBy = serializers.CharField(source="requested_by.username", read_only=True)
    decidedBy = serializers.CharField(
        source="decided_by.username", read_only=True, allow_null=True, default=None
    )
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    decidedAt = serializers.DateTimeField(source="decided_at", read_only=True, allow_null=True)

    class Meta:
        model = RollbackRequest
        fields = (
            "id",
            "workspaceId",
            "target",
            "status",
            "reason",
            "requestedBy",
            "decidedBy",
            "comment",
            "createdAt",
            "decidedAt",
        )


class RolloutEventSerializer(serializers.ModelSerializer):
    workspaceId = serializers.CharField(source="workspace.key", read_only=True)
    profileVersion = serializers.CharField(
        source="version.profile_version", read_only=True, allow_null=True, default=None
    )
    closes = serializers.IntegerField(source="session_id", read_only=True, allow_null=True)
    actor = serializers.CharField(source="actor.username", read_only=True)

    class Meta:
        model = RolloutEvent
        fields = (
            "id",
            "workspaceId",
            "kind",
            "profileVersion",
            "closes",
            "principals",
            "fraction",
            "reason",
            "actor",
            "at",
        )


class SchedulingSerializer(serializers.Serializer):
    enabled = serializers.BooleanField(
        help_text="false turns the kill switch on: runs that start afterwards run serially with "
        "one permit; true allows bounded parallel scheduling again."
    )
    reason = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="Required to turn it off."
    )


class SchedulingStateSerializer(serializers.Serializer):
    parallelScheduling = serializers.ChoiceField(choices=["allowed", "off"])
    lastChange = RolloutEventSerializer(allow_null=True)


class ShadowStartSerializer(serializers.Serializer):
    version = serializers.CharField(help_text="An approved profileVersion, not the current one.")
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class CanaryStartSerializer(serializers.Serializer):
    version = serializers.CharField(help_text="An approved profileVersion never active before.")
    principals = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        default=list,
        help_text="Principals whose runs all use the canary.",
    )
    fraction = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        help_text="A fraction in (0, 1) of the other runs, chosen by invocation id.",
    )
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class NoBodySerializer(serializers.Serializer):
    """The request takes no body."""


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="")


class BoundSerializer(serializers.Serializer):
    bound = serializers.CharField()
    title = serializers.CharField()
    active = serializers.FloatField()
    shadow = serializers.FloatField()
    pass_ = serializers.BooleanField()
    verdict = serializers.CharField()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["pass"] = fields.pop("pass_")
        return fields


class ComparisonSerializer(serializers.Serializer):
    observations = serializers.IntegerField()
    active = serializers.DictField()
    shadow = serializers.DictField()
    bounds = BoundSerializer(many=True)
    passed = serializers.BooleanField()


class SessionSerializer(serializers.Serializer):
    running = RolloutEventSerializer(allow_null=True)
    comparison = ComparisonSerializer(allow_null=True)


# ---------------------------------------------------------------------------- views


APPROVE_EXAMPLE = OpenApiExample(
    "Approve under the runbook",
    request_only=True,
    value={
        "checklist": {key: True for key, _ in services.RUNBOOK_CHECKLIST},
        "comment": "Diff and what-if record read; tighter limits only.",
    },
)
FOUR_EYES_EXAMPLE = OpenApiExample(
    "Four eyes",
    response_only=True,
    status_codes=["403"],
    value={
        "error": {
            "type": "four_eyes",
            "detail": "acme:v2 was proposed by pat; a second person must decide it",
        }
    },
)


_TALLY_ACTIVE = {
    "requests": 30,
    "retries": 0,
    "admitted": 30,
    "deferred": 0,
    "rejected": {},
    "retryableRejected": 0,
    "wouldRetry": 0,
    "queueDelayMs": {"total": 0.0, "max": 0.0},
    "maxQueued": 0,
    "maxRetryPressure": 0,
    "breakerTransitions": {},
}
SHADOW_EXAMPLE = OpenApiExample(
    "A tighter shadow",
    response_only=True,
    value={
        "running": {
            "id": 9,
            "workspaceId": "acme",
            "kind": "shadow-start",
            "profileVersion": "v3",
            "closes": None,
            "principals": [],
            "fraction": None,
            "reason": "compare v3's queue bounds on live traffic",
            "actor": "lena",
            "at": "2025-06-02T09:00:00Z",
        },
        "comparison": {
            "observations": 10,
            "active": _TALLY_ACTIVE,
            "shadow": {
                **_TALLY_ACTIVE,
                "admitted": 24,
                "deferred": 4,
                "rejected": {"queue-full": 6},
                "retryableRejected": 6,
                "wouldRetry": 6,
                "queueDelayMs": {"total": 1800.0, "max": 640.0},
                "maxQueued": 4,
            },
            "bounds": [
                {
                    "bound": "rejectedShare",
                    "title": "Requests rejected",
                    "active": 0.0,
                    "shadow": 0.2,
                    "pass": False,
                    "verdict": "worse: 20.0% against 0.0% (6 more; shadow: queue-full 6)",
                },
                {
                    "bound": "maxQueued",
                    "title": "Deepest queue (waiting requests)",
                    "active": 0,
                    "shadow": 4,
                    "pass": False,
                    "verdict": "worse: 4 against 0",
                },
            ],
            "passed": False,
        },
    },
)


class _VersionActionView(WorkspaceScopedView):
    """POST on one version by label."""

    def get_version(self) -> ProfileVersion:
        label = self.kwargs["profile_version"]
        if label_problem(label) is not None:
            raise NotFound()
        version = selectors.profile_version_get(workspace=self.get_workspace(), label=label)
        if version is None:
            raise NotFound("No such profile version.")
        return version

    def represent(self, version: ProfileVersion) -> dict[str, Any]:
        annotated = selectors.profile_version_list(workspace=self.get_workspace()).get(
            pk=version.pk
        )
        return ProfileVersionSerializer(annotated).data


@extend_schema(
    tags=["workflow"],
    parameters=[WORKSPACE_KEY, PROFILE_VERSION],
    request=ApproveSerializer,
    responses={200: ProfileVersionSerializer, **_refusals()},
    examples=[APPROVE_EXAMPLE, FOUR_EYES_EXAMPLE],
)
class ProfileApproveView(_VersionActionView):
    """Approve a proposed version (approver role; not its proposer; every checklist item)."""

    write_act = access.APPROVE
    serializer_class = ApproveSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ApproveSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        version = self.get_version()
        services.profile_version_approve(
            version=version,
            approver=request_user(request),
            checklist=payload.validated_data["checklist"],
            comment=payload.validated_data["comment"],
        )
        return Response(self.represent(version))


@extend_schema(
    tags=["workflow"],
    parameters=[WORKSPACE_KEY, PROFILE_VERSION],
    request=RejectSerializer,
    responses={200: ProfileVersionSerializer, **_refusals()},
    examples=[
        OpenApiExample(
            "Reject with a reason",
            request_only=True,
            value={"comment": "providers.jev.concurrency is above the documented capacity"},
        ),
        FOUR_EYES_EXAMPLE,
    ],
)
class ProfileRejectView(_VersionActionView):
    """Reject a proposed version with a comment (approver role; not its proposer)."""

    write_act = access.APPROVE
    serializer_class = RejectSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = RejectSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        version = self.get_version()
        services.profile_version_reject(
            version=version,
            approver=request_user(request),
            checklist=payload.validated_data.get("checklist") or {},
            comment=payload.validated_data["comment"],
        )
        return Response(self.represent(version))


@extend_schema(
    tags=["workflow"],
    parameters=[WORKSPACE_KEY, PROFILE_VERSION],
    request=None,
    responses={201: ProfileChangeRecordSerializer, **_refusals()},
    examples=[
        OpenApiExample(
            "Not approved",
            response_only=True,
            status_codes=["409"],
            value={
                "error": {
                    "type": "conflict",
                    "detail": "acme:v2 is not approved yet; only approved versions activate",
                }
            },
        )
    ],
)
class ProfileActivateView(_VersionActionView):
    """Make an approved, never-active version current (operator role); a `change` record."""

    write_act = access.ACTIVATE
    serializer_class = NoBodySerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        version = self.get_version()
        record = services.profile_version_activate(version=version, actor=request_user(request))
        return Response(ProfileChangeRecordSerializer(record).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=["workflow"], parameters=[WORKSPACE_KEY])
class RollbackListView(WorkspaceScopedView, generics.ListAPIView):
    """Rollback requests of the workspace, newest first; POST requests one (operator role)."""

    serializer_class = RollbackRequestSerializer
    pagination_class = NewestIdFirstPagination
    filter_backends: list[Any] = []
    write_act = access.ACTIVATE

    def get_queryset(self) -> QuerySet[RollbackRequest]:
        if getattr(self, "swagger_fake_view", False):
            return RollbackRequest.objects.none()
        return (
            RollbackRequest.objects.filter(workspace=self.get_workspace())
            .select_related("workspace", "target", "requested_by", "decided_by")
            .order_by("-id")
        )

    @extend_schema(
        request=RollbackCreateSerializer,
        responses={201: RollbackRequestSerializer, **_refusals()},
        examples=[
            OpenApiExample(
                "Roll back",
                request_only=True,
                value={"target": "v1", "reason": "v2 rejects quiet principals' requests"},
            )
        ],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = RollbackCreateSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        workspace = self.get_workspace()
        label = payload.validated_data["target"]
        target = (
            selectors.profile_version_get(workspace=workspace, label=label)
            if label_problem(label) is None
            else None
        )
        if target is None:
            raise ValidationError({"target": ["names no profile version of this workspace"]})
        if not payload.validated_data["reason"].strip():
            raise ValidationError({"reason": ["say why the rollback is needed"]})
        created = services.rollback_request_create(
            workspace=workspace,
            target=target,
            requested_by=request_user(request),
            reason=payload.validated_data["reason"],
        )
        return Response(RollbackRequestSerializer(created).data, status=status.HTTP_201_CREATED)


class _RollbackActionView(WorkspaceScopedView):
    write_act = access.APPROVE

    def get_rollback(self) -> RollbackRequest:
        found = (
            RollbackRequest.objects.filter(
                workspace=self.get_workspace(), pk=self.kwargs["rollback_id"]
            )
            .select_related("workspace", "target__workspace", "requested_by", "decided_by")
            .first()
        )
        if found is None:
            raise NotFound("No such rollback request.")
        return found


@extend_schema(
    tags=["workflow"],
    parameters=[WORKSPACE_KEY, ROLLBACK_ID],
    request=CommentSerializer,
    responses={201: ProfileChangeRecordSerializer, **_refusals()},
    examples=[FOUR_EYES_EXAMPLE],
)
class RollbackApproveView(_RollbackActionView):
    """Approve a pending rollback (approver role; not its requester): activates its target."""

    serializer_class = CommentSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = CommentSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        record = services.rollback_request_approve(
            request=self.get_rollback(),
            approver=request_user(request),
            comment=payload.validated_data["comment"],
        )
        return Response(ProfileChangeRecordSerializer(record).data, status=status.HTTP_201_CREATED)


@extend_schema(
    tags=["workflow"],
    parameters=[WORKSPACE_KEY, ROLLBACK_ID],
    request=RejectCommentSerializer,
    responses={200: RollbackRequestSerializer, **_refusals()},
)
class RollbackRejectView(_RollbackActionView):
    """Reject a pending rollback with a comment (approver role; not its requester)."""

    serializer_class = RejectCommentSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = RejectCommentSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        decided = services.rollback_request_reject(
            request=self.get_rollback(),
            approver=request_user(request),
            comment=payload.validated_data["comment"],
        )
        return Response(RollbackRequestSerializer(decided).data)


# ------------------------------------------------------------------ rollout controls


@extend_schema(tags=["rollout"], parameters=[WORKSPACE_KEY])
class SchedulingView(WorkspaceScopedView):
    """The kill switch: GET reads it; POST turns bounded parallel scheduling off or on (operator
    role). The change holds from the next run boundary; runs in flight keep their setting."""

    write_act = access.OPERATE
    serializer_class = SchedulingSerializer

    def _state(self) -> dict[str, Any]:
        workspace = self.get_workspace()
        last = (
            rollout.rollout_events(workspace=workspace)
            .filter(kind__in=[RolloutEvent.Kind.PARALLEL_OFF, RolloutEvent.Kind.PARALLEL_ON])
            .first()
        )
        allowed = rollout.parallel_scheduling_allowed(workspace=workspace)
        return {
            "parallelScheduling": "allowed" if allowed else "off",
            "lastChange": RolloutEventSerializer(last).data if last is not None else None,
        }

    @extend_schema(
        responses={200: SchedulingStateSerializer, 404: NOT_FOUND},
        examples=[
            OpenApiExample(
                "Kill switch on",
                response_only=True,
                value={
                    "parallelScheduling": "off",
                    "lastChange": {
                        "id": 7,
                        "workspaceId": "acme",
                        "kind": "parallel-off",
                        "profileVersion": None,
                        "closes": None,
                        "principals": [],
                        "fraction": None,
                        "reason": "provider latency doubled since 14:05",
                        "actor": "lena",
                        "at": "2025-06-02T14:07:12Z",
                    },
                },
            )
        ],
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self._state())

    @extend_schema(
        request=SchedulingSerializer,
        responses={200: SchedulingStateSerializer, **_refusals()},
        examples=[
            OpenApiExample(
                "Kill switch",
                request_only=True,
                value={"enabled": False, "reason": "provider latency doubled since 14:05"},
            ),
            OpenApiExample("Allow again", request_only=True, value={"enabled": True}),
        ],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = SchedulingSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        rollout.parallel_scheduling_set(
            workspace=self.get_workspace(),
            actor=request_user(request),
            allowed=payload.validated_data["enabled"],
            reason=payload.validated_data["reason"],
        )
        return Response(self._state())


class _SessionView(WorkspaceScopedView):
    write_act = access.OPERATE
    start_kind = RolloutEvent.Kind.SHADOW_START

    def running(self) -> RolloutEvent | None:
        if self.start_kind == RolloutEvent.Kind.SHADOW_START:
            return rollout.shadow_current(workspace=self.get_workspace())
        return rollout.canary_current(workspace=self.get_workspace())

    def comparison(self, running: RolloutEvent) -> rollout.Comparison:
        return rollout.shadow_comparison(session=running)

    def state(self) -> dict[str, Any]:
        running = self.running()
        return {
            "running": RolloutEventSerializer(running).data if running is not None else None,
            "comparison": self.comparison(running).to_dict() if running is not None else None,
        }

    def version(self, label: str) -> ProfileVersion:
        version = (
            selectors.profile_version_get(workspace=self.get_workspace(), label=label)
            if label_problem(label) is None
            else None
        )
        if version is None:
            raise ValidationError({"version": ["names no profile version of this workspace"]})
        return version


@extend_schema(tags=["rollout"], parameters=[WORKSPACE_KEY])
class ShadowView(_SessionView):
    """The workspace's shadow: GET shows it with its comparison (active against shadow, a
    verdict per bound); POST starts one (operator role)."""

    serializer_class = ShadowStartSerializer

    @extend_schema(responses={200: SessionSerializer, 404: NOT_FOUND}, examples=[SHADOW_EXAMPLE])
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self.state())

    @extend_schema(
        request=ShadowStartSerializer,
        responses={201: SessionSerializer, **_refusals()},
        examples=[
            OpenApiExample(
                "Shadow v3",
                request_only=True,
                value={"version": "v3", "reason": "compare v3's queue bounds on live traffic"},
            )
        ],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ShadowStartSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        rollout.shadow_start(
            version=self.version(payload.validated_data["version"]),
            actor=request_user(request),
            reason=payload.validated_data["reason"],
        )
        return Response(self.state(), status=status.HTTP_201_CREATED)


@extend_schema(
    tags=["rollout"],
    parameters=[WORKSPACE_KEY],
    request=ReasonSerializer,
    responses={200: RolloutEventSerializer, **_refusals()},
)
class ShadowStopView(_SessionView):
    """Stop the workspace's shadow (operator role); its observations stay readable."""

    serializer_class = ReasonSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReasonSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        event = rollout.shadow_stop(
            workspace=self.get_workspace(),
            actor=request_user(request),
            reason=payload.validated_data["reason"],
        )
        return Response(RolloutEventSerializer(event).data)


class _CanaryMixin:
    start_kind = RolloutEvent.Kind.CANARY_START

    def comparison(self, running: RolloutEvent) -> rollout.Comparison:
        return comparisons.canary_comparison(running)


@extend_schema(tags=["rollout"], parameters=[WORKSPACE_KEY])
class CanaryView(_CanaryMixin, _SessionView):
    """The workspace's canary: GET shows it with its comparison (current version against the
    canary, from the runs since it started); POST starts one (operator role)."""

    serializer_class = CanaryStartSerializer

    @extend_schema(responses={200: SessionSerializer, 404: NOT_FOUND})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(self.state())

    @extend_schema(
        request=CanaryStartSerializer,
        responses={201: SessionSerializer, **_refusals()},
        examples=[
            OpenApiExample(
                "A tenth of runs and one principal",
                request_only=True,
                value={
                    "version": "v3",
                    "principals": ["quiet-1"],
                    "fraction": 0.1,
                    "reason": "below the documented capacity",
                },
            )
        ],
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = CanaryStartSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        rollout.canary_start(
            version=self.version(data["version"]),
            actor=request_user(request),
            principals=data["principals"],
            fraction=data["fraction"],
            reason=data["reason"],
        )
        return Response(self.state(), status=status.HTTP_201_CREATED)


@extend_schema(
    tags=["rollout"],
    parameters=[WORKSPACE_KEY],
    request=ReasonSerializer,
    responses={200: ProfileChangeRecordSerializer, **_refusals()},
)
class CanaryPromoteView(_CanaryMixin, _SessionView):
    """Promote the canary: its version becomes current for every run (operator role)."""

    serializer_class = ReasonSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReasonSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        _event, record = rollout.canary_promote(
            workspace=self.get_workspace(),
            actor=request_user(request),
            reason=payload.validated_data["reason"],
        )
        return Response(ProfileChangeRecordSerializer(record).data)


@extend_schema(
    tags=["rollout"],
    parameters=[WORKSPACE_KEY],
    request=ReasonSerializer,
    responses={200: RolloutEventSerializer, **_refusals()},
)
class CanaryAbandonView(_CanaryMixin, _SessionView):
    """Abandon the canary: every later run uses the current version (operator role)."""

    serializer_class = ReasonSerializer

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ReasonSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        event = rollout.canary_abandon(
            workspace=self.get_workspace(),
            actor=request_user(request),
            reason=payload.validated_data["reason"],
        )
        return Response(RolloutEventSerializer(event).data)


@extend_schema(tags=["rollout"], parameters=[WORKSPACE_KEY])
class RolloutEventListView(WorkspaceScopedView, generics.ListAPIView):
    """The workspace's rollout audit (kill switch, shadows, canaries), newest first."""

    serializer_class = RolloutEventSerializer
    pagination_class = NewestIdFirstPagination
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[RolloutEvent]:
        if getattr(self, "swagger_fake_view", False):
            return RolloutEvent.objects.none()
        return rollout.rollout_events(workspace=self.get_workspace())
