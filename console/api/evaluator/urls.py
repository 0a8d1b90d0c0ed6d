"""Evaluation and load-run routes, under the workspace's key like the profile routes."""

from __future__ import annotations

from django.urls import path

from console.api.evaluator import usage, views

_WORKSPACE = "workspaces/<slug:workspace_key>"

urlpatterns = [
    path(f"{_WORKSPACE}/usage/", usage.UsageView.as_view(), name="workspace-usage"),
    path(f"{_WORKSPACE}/usage.csv", usage.UsageCsvView.as_view(), name="workspace-usage-csv"),
    path(
        f"{_WORKSPACE}/evaluations/",
        views.EvaluationRunListView.as_view(),
        name="workspace-evaluation-list",
    ),
    path(
        f"{_WORKSPACE}/evaluations/<str:run_id>/",
        views.EvaluationRunDetailView.as_view(),
        name="workspace-evaluation-detail",
    ),
    path(
        f"{_WORKSPACE}/evaluations/<str:run_id>/cancel/",
        views.EvaluationRunCancelView.as_view(),
        name="workspace-evaluation-cancel",
    ),
    path(
        f"{_WORKSPACE}/load-runs/",
        views.LoadRunListView.as_view(),
        name="workspace-load-run-list",
    ),
    path(
        f"{_WORKSPACE}/load-runs/<str:run_id>/",
        views.LoadRunDetailView.as_view(),
        name="workspace-load-run-detail",
    ),
    path(
        f"{_WORKSPACE}/load-runs/<str:run_id>/cancel/",
        views.LoadRunCancelView.as_view(),
        name="workspace-load-run-cancel",
    ),
    path(
        f"{_WORKSPACE}/profiles/<path:profile_version>/what-if/",
        views.WhatIfRunListView.as_view(),
        name="workspace-profile-what-if",
    ),
]
