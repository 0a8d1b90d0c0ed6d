"""API routes; workspaces are addressed by key, versions by their profileVersion label."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from console.api.admission import views, workflow

router = SimpleRouter()
router.register("workspaces", views.WorkspaceViewSet, basename="workspace")

_WORKSPACE = "workspaces/<slug:workspace_key>"

urlpatterns = [
    path(
        f"{_WORKSPACE}/profile-history/",
        views.ProfileHistoryView.as_view(),
        name="workspace-profile-history",
    ),
    path(
        f"{_WORKSPACE}/profiles/",
        views.ProfileVersionListView.as_view(),
        name="workspace-profile-list",
    ),
    # Actions before the detail route: a label may contain "/".
    path(
        f"{_WORKSPACE}/profiles/<path:profile_version>/approve/",
        workflow.ProfileApproveView.as_view(),
        name="workspace-profile-approve",
    ),
    path(
        f"{_WORKSPACE}/profiles/<path:profile_version>/reject/",
        workflow.ProfileRejectView.as_view(),
        name="workspace-profile-reject",
    ),
    path(
        f"{_WORKSPACE}/profiles/<path:profile_version>/activate/",
        workflow.ProfileActivateView.as_view(),
        name="workspace-profile-activate",
    ),
    path(
        f"{_WORKSPACE}/profiles/<path:profile_version>/",
        views.ProfileVersionDetailView.as_view(),
        name="workspace-profile-detail",
    ),
    path(
        f"{_WORKSPACE}/rollbacks/",
        workflow.RollbackListView.as_view(),
        name="workspace-rollback-list",
    ),
    path(
        f"{_WORKSPACE}/rollbacks/<int:rollback_id>/approve/",
        workflow.RollbackApproveView.as_view(),
        name="workspace-rollback-approve",
    ),
    path(
        f"{_WORKSPACE}/rollbacks/<int:rollback_id>/reject/",
        workflow.RollbackRejectView.as_view(),
        name="workspace-rollback-reject",
    ),
    path(
        f"{_WORKSPACE}/scheduling/",
        workflow.SchedulingView.as_view(),
        name="workspace-scheduling",
    ),
    path(f"{_WORKSPACE}/shadow/", workflow.ShadowView.as_view(), name="workspace-shadow"),
    path(
        f"{_WORKSPACE}/shadow/stop/",
        workflow.ShadowStopView.as_view(),
        name="workspace-shadow-stop",
    ),
    path(f"{_WORKSPACE}/canary/", workflow.CanaryView.as_view(), name="workspace-canary"),
    path(
        f"{_WORKSPACE}/canary/promote/",
        workflow.CanaryPromoteView.as_view(),
        name="workspace-canary-promote",
    ),
    path(
        f"{_WORKSPACE}/canary/abandon/",
        workflow.CanaryAbandonView.as_view(),
        name="workspace-canary-abandon",
    ),
    path(
        f"{_WORKSPACE}/rollout-events/",
        workflow.RolloutEventListView.as_view(),
        name="workspace-rollout-events",
    ),
    *router.urls,
]
