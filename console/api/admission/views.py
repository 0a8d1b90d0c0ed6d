"""Thin API views: find the caller's workspace, read via selectors, write via services."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, serializers, status, viewsets
from rest_framework.exceptions import NotAuthenticated, NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from admission import access, selectors
from admission.core.labels import label_problem
from admission.models import ProfileChangeRecord, ProfileVersion, Workspace
from admission.services import profiles as services
from console.api.admission.filters import ProfileHistoryFilter
from console.api.admission.serializers import (
    ErrorSerializer,
    ProfileChangeRecordSerializer,
    ProfileProposeSerializer,
    ProfileVersionSerializer,
    WorkspaceSerializer,
)
from console.api.pagination import ProfileHistoryPagination, ProfileVersionPagination
from console.api.permissions import WorkspaceActPermission

if TYPE_CHECKING:
    from rest_framework.permissions import _PermissionClass

WORKSPACE_KEY = OpenApiParameter(
    "workspace_key",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="The workspace's key (the admission core's workspace_id).",
)
NOT_FOUND = OpenApiResponse(ErrorSerializer, description="No such workspace visible to you.")


def request_user(request: Request) -> Any:
    """The authenticated caller; permission classes have already refused anyone else."""
    user = request.user
    if not isinstance(user, get_user_model()):
        raise NotAuthenticated()
    return user


@extend_schema(tags=["workspaces"])
class WorkspaceViewSet(viewsets.ReadOnlyModelViewSet):
    """Workspaces the caller belongs to (any role)."""

    serializer_class = WorkspaceSerializer
    lookup_field = "key"
    lookup_url_kwarg = "workspace_key"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    filter_backends: list[Any] = []

    def get_queryset(self) -> QuerySet[Workspace]:
        return selectors.workspace_list_for_user(user=self.request.user, act=access.VIEW)


class WorkspaceScopedMixin:
    """Resolves `workspace_key` to a workspace the caller belongs to, or answers 404.

    `WorkspaceActPermission` then asks `admission.access` for `read_act` (safe methods) or
    `write_act` (the others) in it; `starts_runs` puts POSTs under the submission throttle.
    """

    request: Any
    kwargs: dict[str, Any]
    permission_classes: Sequence[_PermissionClass] = [IsAuthenticated, WorkspaceActPermission]
    read_act: str | None = access.VIEW
    write_act: str | None = None
    starts_runs = False
    _workspace: Workspace | None = None

    def get_workspace(self) -> Workspace:
        if self._workspace is None:
            workspace = selectors.workspace_get_for_user(
                user=self.request.user, key=self.kwargs["workspace_key"], act=access.VIEW
            )
            if workspace is None:
                raise NotFound("No such workspace.")
            self._workspace = workspace
        return self._workspace

    @property
    def resolved_workspace(self) -> Workspace | None:
        """The workspace once the caller was allowed to see it (the workspace throttle's key)."""
        return self._workspace


class WorkspaceScopedView(WorkspaceScopedMixin, generics.GenericAPIView):
    """A workspace-scoped API view."""


@extend_schema(
    tags=["profiles"],
    parameters=[WORKSPACE_KEY],
    responses={200: ProfileChangeRecordSerializer(many=True), 404: NOT_FOUND},
)
class ProfileHistoryView(WorkspaceScopedView, generics.ListAPIView):
    """The workspace's `decision-admission-profile-change/v1` records, newest first."""

    serializer_class = ProfileChangeRecordSerializer
    pagination_class = ProfileHistoryPagination
    filterset_class = ProfileHistoryFilter

    def get_queryset(self) -> QuerySet[ProfileChangeRecord]:
        if getattr(self, "swagger_fake_view", False):
            return ProfileChangeRecord.objects.none()
        return selectors.profile_history_list(workspace=self.get_workspace())


class ProfileVersionListView(WorkspaceScopedView, generics.ListCreateAPIView):
    """Profile versions of a workspace with their decisions and digests; POST proposes one."""

    serializer_class = ProfileVersionSerializer
    body_limit_setting = "SLUICE_MAX_PROFILE_REQUEST_BYTES"
    pagination_class = ProfileVersionPagination
    filter_backends: list[Any] = []
    write_act = access.PROPOSE
    # A proposal is refused for its document alone: every refusal answers 400 naming it.
    refusal_field = "document"

    def get_queryset(self) -> QuerySet[ProfileVersion]:
        if getattr(self, "swagger_fake_view", False):
            return ProfileVersion.objects.none()
        return selectors.profile_version_list(workspace=self.get_workspace())

    def get_serializer_class(self) -> type[serializers.Serializer]:
        # The browsable API's form for POST shows the proposal's input, not the listing.
        if self.request is not None and self.request.method == "POST":
            return ProfileProposeSerializer
        return ProfileVersionSerializer

    @extend_schema(
        tags=["profiles"],
        parameters=[WORKSPACE_KEY],
        responses={200: ProfileVersionSerializer(many=True), 404: NOT_FOUND},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        tags=["profiles"],
        parameters=[WORKSPACE_KEY],
        request=ProfileProposeSerializer,
        responses={
            201: ProfileVersionSerializer,
            200: OpenApiResponse(
                ProfileVersionSerializer, description="The same document was already proposed."
            ),
            400: OpenApiResponse(ErrorSerializer, description="Invalid or conflicting document."),
            404: NOT_FOUND,
        },
    )
    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        payload = ProfileProposeSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            version = services.profile_version_propose(
                workspace=self.get_workspace(),
                document=payload.validated_data["document"],
                proposed_by=request_user(request),
            )
        except services.ProfileVersionDuplicate as duplicate:
            return Response(self._represent(duplicate.version), status=status.HTTP_200_OK)
        return Response(self._represent(version), status=status.HTTP_201_CREATED)

    def _represent(self, version: ProfileVersion) -> dict[str, Any]:
        annotated = self.get_queryset().get(pk=version.pk)
        return ProfileVersionSerializer(annotated, context=self.get_serializer_context()).data


@extend_schema(
    tags=["profiles"],
    parameters=[
        WORKSPACE_KEY,
        OpenApiParameter(
            "profile_version", OpenApiTypes.STR, OpenApiParameter.PATH, description="The label."
        ),
    ],
    responses={200: ProfileVersionSerializer, 404: NOT_FOUND},
)
class ProfileVersionDetailView(WorkspaceScopedView, generics.RetrieveAPIView):
    """One profile version by its `profileVersion` label."""

    serializer_class = ProfileVersionSerializer
    filter_backends: list[Any] = []
    lookup_field = "profile_version"

    def get_queryset(self) -> QuerySet[ProfileVersion]:
        if getattr(self, "swagger_fake_view", False):
            return ProfileVersion.objects.none()
        return selectors.profile_version_list(workspace=self.get_workspace())

    def get_object(self) -> ProfileVersion:
        # A label no version can have (NUL, control characters, too long) names nothing.
        if label_problem(self.kwargs["profile_version"]) is not None:
            raise NotFound()
        return super().get_object()
