"""Operator documents served read-only, so links from the admin forms resolve."""

from __future__ import annotations

import re

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path
from django.views.decorators.http import require_safe

app_name = "admission"

RUNBOOK_DIR = settings.BASE_DIR / "docs" / "runbooks"
# Runbook ids are a closed vocabulary of file names; nothing else in the folder is reachable.
_RUNBOOK_ID = re.compile(r"^RUN-[A-Z0-9]+(?:-[A-Z0-9]+)*-v[0-9]+$")


@require_safe
@login_required
def runbook_detail(request: HttpRequest, runbook_id: str) -> HttpResponse:
    if not _RUNBOOK_ID.match(runbook_id):
        raise Http404("no such runbook")
    source = RUNBOOK_DIR / f"{runbook_id}.md"
    if not source.is_file():
        raise Http404("no such runbook")
    text = source.read_text(encoding="utf-8")
    return render(request, "admission/runbook.html", {"runbook_id": runbook_id, "text": text})


urlpatterns = [
    path("<str:runbook_id>/", runbook_detail, name="runbook"),
]
