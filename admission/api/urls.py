"""API routes; workspaces are addressed by key, versions by their profileVersion label."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from admission.api import views

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
    path(
        f"{_WORKSPACE}/profiles/<path:profile_version>/",
        views.ProfileVersionDetailView.as_view(),
        name="workspace-profile-detail",
    ),
    *router.urls,
]
