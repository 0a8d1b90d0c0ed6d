"""The read path of evaluation and load runs, for the API and the admin."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from admission.models import ProfileVersion, Workspace
from evaluator.models import EvaluationRun, LoadRun


def evaluation_run_list(
    *, workspace: Workspace, status: str | None = None
) -> QuerySet[EvaluationRun]:
    """A workspace's evaluation runs, newest first."""
    runs = EvaluationRun.objects.filter(workspace=workspace).select_related(
        "workspace", "submitted_by"
    )
    if status:
        runs = runs.filter(status=status)
    return runs.order_by("-created_at", "-id")


def evaluation_run_get(*, workspace: Workspace, run_id: str) -> EvaluationRun | None:
    """One run of the workspace by id, or None (also for a malformed id)."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return evaluation_run_list(workspace=workspace).filter(pk=key).first()


def load_run_list(*, workspace: Workspace) -> QuerySet[LoadRun]:
    """A workspace's load runs, newest first."""
    return (
        LoadRun.objects.filter(workspace=workspace)
        .select_related("workspace", "submitted_by", "what_if_version")
        .order_by("-created_at", "-id")
    )


def load_run_get(*, workspace: Workspace, run_id: str) -> LoadRun | None:
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return load_run_list(workspace=workspace).filter(pk=key).first()


def what_if_run_list(*, version: ProfileVersion) -> QuerySet[LoadRun]:
    """The what-if runs of one profile version, newest first."""
    return (
        LoadRun.objects.filter(what_if_version=version)
        .select_related("workspace", "submitted_by", "what_if_version")
        .order_by("-created_at", "-id")
    )


def run_admissions_since(
    *, workspace: Workspace, since: Any, until: Any = None
) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """(profile version, attempts) of the workspace's finished evaluation runs started in the
    window, oldest first: what a canary comparison counts."""
    runs = EvaluationRun.objects.filter(
        workspace=workspace, started_at__gte=since, finished_at__isnull=False
    )
    if until is not None:
        runs = runs.filter(started_at__lte=until)
    return [
        (version, list(attempts or []))
        for version, attempts in runs.order_by("started_at", "id").values_list(
            "profile_version", "attempts"
        )
    ]
