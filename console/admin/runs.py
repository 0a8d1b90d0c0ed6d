"""Admin for evaluation runs, load runs and receipts: start runs through the services, read
everything else. Run rows change only through their worker, so nothing here edits them.
Every list, page and form is limited to the user's workspaces (`admission.access`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from admission import access
from console.admin.kit import REFUSALS, FormPage, create_page, report_refusal
from console.admin.profiles import (
    WORKSPACE_FILTER,
    NoEditAdminMixin,
    ReadOnlyAdminMixin,
    WorkspaceScopedAdminMixin,
    json_block,
)
from console.charts.load_runs import load_run_bounds, load_run_glance
from console.forms.runs import EvaluationSubmitForm, LoadRunStartForm
from console.templatetags.readable import readable_number
from evaluator import selectors
from evaluator.models import EvaluationRun, LoadRun, Receipt
from evaluator.services import cancellation, load_runs
from evaluator.services import runs as services

RUN_FORM = "admin/evaluator/run_form.html"
SUBMIT_PAGE = FormPage(
    RUN_FORM,
    "Submit an evaluation",
    {
        "submit_label": "Submit evaluation",
        "intro": "You are the principal; limits come from the workspace's active profile.",
    },
    # A refusal names a field of the request document the form's `document` holds.
    document="document",
)
START_PAGE = FormPage(
    RUN_FORM,
    "Start a load run",
    {
        "submit_label": "Start load run",
        "intro": "The manifest's arrivals are released on virtual time; the record is "
        "digest-bound and shown here when the worker finishes.",
    },
)


def _table(headers: tuple[str, ...], rows: Any) -> SafeString | str:
    """A small escaped HTML table for a read-only admin field; a dash when there are no rows."""
    # Numbers rounded for reading; the JSON beside keeps every digit.
    rows = [tuple(readable_number(cell) for cell in row) for row in rows]
    if not rows:
        return "—"
    cells = "".join("<td>{}</td>" for _ in headers)
    head = format_html_join("", "<th>{}</th>", ((name,) for name in headers))
    body = format_html_join("", "<tr>" + cells + "</tr>", rows)
    return format_html("<table><thead><tr>{}</tr></thead><tbody>{}</tbody></table>", head, body)


def _pretty(document: Any) -> SafeString:
    return json_block(document, style="max-height: 40em; overflow: auto")


class RunAdminMixin(NoEditAdminMixin):
    """Rows written by workers: viewable, never changed or deleted by hand; the page of an
    unfinished run reloads itself every `REFRESH_SECONDS`."""

    REFRESH_SECONDS = 3
    change_form_template: Any = "admin/evaluator/run_change_form.html"
    # The action that cancels a run of this kind, offered on an unfinished run's page.
    cancel_action = ""

    def may_cancel(self, user: Any, run: Any) -> bool:
        """Whether `user` may cancel `run` (the service decides again when asked)."""
        return False

    def _cancel_each(
        self, request: HttpRequest, queryset: QuerySet[Any], cancel: Callable[[Any, Any], Any]
    ) -> None:
        """Ask the service to cancel each run, reporting each refusal or request on its own."""
        model_admin: Any = self  # a ModelAdmin: the mixin is only used with one
        for run in queryset.select_related("workspace"):
            try:
                done = cancel(run, request.user)
            except REFUSALS as error:
                report_refusal(model_admin, request, error, about=run)
                continue
            # Kept in the admin's change log too, beside the request on the row itself.
            model_admin.log_change(request, done, "Cancel requested.")
            if done.finished:
                model_admin.message_user(request, f"Cancelled {done}.", messages.SUCCESS)
            else:
                model_admin.message_user(
                    request,
                    f"Cancel requested for {done}; its worker stops it within seconds.",
                    messages.SUCCESS,
                )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """An unfinished run's page reloads itself and, for whoever may cancel it, offers a
        button that runs the cancel action on it."""
        run = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        context = dict(extra_context or {})
        if run is not None and not run.finished:
            context["refresh_seconds"] = self.REFRESH_SECONDS
            if self.may_cancel(request.user, run):
                context["cancel_action"] = self.cancel_action
        return super().change_view(request, object_id, form_url, context)  # type: ignore[misc]

    @admin.display(description="duration")
    def duration(self, obj: EvaluationRun | LoadRun) -> str:
        if obj.started_at is None:
            return "—"
        if obj.finished_at is None:
            return f"{(timezone.now() - obj.started_at).total_seconds():.1f} s so far"
        return f"{(obj.finished_at - obj.started_at).total_seconds():.2f} s"

    @admin.display(description="error")
    def error_pretty(self, obj: EvaluationRun | LoadRun) -> SafeString:
        return _pretty(obj.error)


@admin.register(EvaluationRun)
class EvaluationRunAdmin(WorkspaceScopedAdminMixin, RunAdminMixin, admin.ModelAdmin):
    list_display = (
        "short_id",
        "workspace",
        "principal_id",
        "ruleset_id",
        "status",
        "profile_version",
        "decision_count",
        "deliveries",
        "created_at",
        "duration",
    )
    list_filter = ("status", WORKSPACE_FILTER, "created_at")
    list_select_related = ("workspace",)
    search_fields = ("=id", "invocation_id", "ruleset_id", "principal_id")
    readonly_fields = (
        "id",
        "workspace",
        "principal_id",
        "submitted_by",
        "invocation_id",
        "status",
        "profile_version",
        "ruleset_id",
        "ruleset_digest",
        "decision_count",
        "deliveries",
        "task_id",
        "created_at",
        "started_at",
        "finished_at",
        "updated_at",
        "duration",
        "cancel_requested_at",
        "cancel_requested_by",
        "progress",
        "error_pretty",
        "outcomes",
        "attempts_table",
        "result_pretty",
        "request_pretty",
    )
    fields = readonly_fields
    add_act = access.EVALUATE
    actions = ("cancel_runs",)

    @admin.display(description="run")
    def short_id(self, obj: EvaluationRun) -> str:
        return str(obj.pk)[:8]

    cancel_action = "cancel_runs"

    def may_cancel(self, user: Any, run: EvaluationRun) -> bool:
        return cancellation.may_cancel(user, run)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        # Members cancel their own runs; the service decides per run.
        return access.workspaces_for(request.user, access.EVALUATE).exists()

    @admin.action(description="Cancel the selected evaluation runs", permissions=["cancel"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[EvaluationRun]) -> None:
        self._cancel_each(request, queryset, cancellation.evaluation_run_cancel)

    def _progress(self, obj: EvaluationRun) -> selectors.RunProgress:
        # The page shows several fields of one progress read.
        cached = getattr(obj, "_sluice_progress", None)
        if cached is None:
            cached = selectors.evaluation_run_progress(obj)
            obj._sluice_progress = cached  # type: ignore[attr-defined]
        return cached

    @admin.display(description="progress")
    def progress(self, obj: EvaluationRun) -> str:
        progress = self._progress(obj)
        parts = [f"{progress.decisions_done} of {progress.decisions_total} decisions done"]
        if progress.outcomes:
            counts = ", ".join(f"{count} {status}" for status, count in progress.outcomes.items())
            parts[0] += f" ({counts})"
        parts.append(f"{len(progress.attempts)} attempts")
        if progress.refusals:
            counts = ", ".join(f"{n} {reason}" for reason, n in progress.refusals.items())
            parts.append(f"admission refusals: {counts}")
        outage = progress.outage
        if outage is not None:
            parts.append(
                f"outage: {outage['decisionsDelayed']} decisions waited "
                f"{outage['waitedMs'] / 1000:.1f} s for admission, "
                f"{outage['decisionsUnanswered']} ended unanswered"
            )
        if progress.in_flight:
            calls = ", ".join(
                f"{flight['decisionId']} on {flight['adapterId']} #{flight['number']} "
                f"(admission: {(flight.get('evidence') or {}).get('decision', '—')})"
                for flight in progress.in_flight
            )
            parts.append(f"{len(progress.in_flight)} in flight: {calls}")
        if progress.max_in_flight:
            parts.append(f"at most {progress.max_in_flight} in flight at once")
        return " · ".join(parts)

    @admin.display(description="result")
    def result_pretty(self, obj: EvaluationRun) -> SafeString:
        return _pretty(obj.result)

    @admin.display(description="request")
    def request_pretty(self, obj: EvaluationRun) -> SafeString:
        return _pretty(obj.document)

    @admin.display(description="outcomes (ruleset order)")
    def outcomes(self, obj: EvaluationRun) -> SafeString | str:
        decisions = (obj.result or {}).get("decisions") or []
        return _table(
            ("decision", "status", "output"),
            ((d["decisionId"], d["status"], json.dumps(d.get("output"))) for d in decisions),
        )

    @admin.display(description="attempts with admission evidence")
    def attempts_table(self, obj: EvaluationRun) -> SafeString | str:
        attempts = self._progress(obj).attempts
        if not attempts:
            return "—"

        def row(attempt: dict[str, Any]) -> tuple[Any, ...]:
            evidence = attempt.get("evidence") or {}
            return (
                attempt.get("decisionId"),
                f"{attempt.get('adapterId')} #{attempt.get('number')}",
                "yes" if attempt.get("sent") else "no",
                attempt.get("outcome"),
                attempt.get("reason"),
                f"{evidence.get('decision', '—')} / {evidence.get('reason', '—')}",
                readable_number(evidence.get("queueDelayMs", "—")),
                readable_number(evidence.get("active", "—")),
            )

        rows = format_html_join(
            "", "<tr>" + "<td>{}</td>" * 8 + "</tr>", (row(a) for a in attempts)
        )
        return format_html(
            "<table><thead><tr><th>decision</th><th>target</th><th>sent</th><th>outcome</th>"
            "<th>reason</th><th>admission</th><th>queue delay ms</th><th>active</th></tr>"
            "</thead><tbody>{}</tbody></table>",
            rows,
        )

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Submit an evaluation as the signed-in operator, through the submit service."""

        def submit(form: Any) -> tuple[EvaluationRun, str]:
            run, _ = services.evaluation_run_submit(
                form.cleaned_data["workspace"], request.user, form.cleaned_data["document"]
            )
            return run, f"Submitted evaluation {run.pk}; a worker runs it."

        return create_page(self, request, EvaluationSubmitForm, submit, SUBMIT_PAGE)


@admin.register(LoadRun)
class LoadRunAdmin(WorkspaceScopedAdminMixin, RunAdminMixin, admin.ModelAdmin):
    list_display = (
        "manifest_name",
        "target",
        "workspace",
        "status",
        "passed",
        "submitted_by",
        "created_at",
        "duration",
    )
    list_filter = ("status", "target", "passed")
    list_select_related = ("workspace", "submitted_by")
    readonly_fields = (
        "id",
        "workspace",
        "manifest_name",
        "target",
        "status",
        "passed",
        "manifest_digest",
        "submitted_by",
        "deliveries",
        "task_id",
        "created_at",
        "started_at",
        "finished_at",
        "updated_at",
        "duration",
        "load_progress",
        "cancel_requested_at",
        "cancel_requested_by",
        "error_pretty",
        "comparisons",
        "record_pretty",
    )
    fields = readonly_fields
    actions = ("run_again", "cancel_load_runs")
    add_act = access.RUN_LOAD

    cancel_action = "cancel_load_runs"

    def may_cancel(self, user: Any, run: LoadRun) -> bool:
        return load_runs.may_cancel_load_run(user, run)

    @admin.display(description="progress")
    def load_progress(self, obj: LoadRun) -> str:
        if obj.progress is None:
            return "-"
        return f"{obj.progress:.0%}"

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        # Proposers cancel their own what-if runs; the service decides per run.
        return access.workspaces_for(request.user, access.PROPOSE).exists()

    @admin.action(description="Cancel the selected load runs", permissions=["cancel"])
    def cancel_load_runs(self, request: HttpRequest, queryset: QuerySet[LoadRun]) -> None:
        self._cancel_each(request, queryset, load_runs.load_run_cancel)

    def render_change_form(
        self, request: HttpRequest, context: dict[str, Any], *args: Any, **kwargs: Any
    ) -> Any:
        """The page leads with the record's charts, each beside the numbers it shows."""
        run = context.get("original")
        if run is not None:
            context["glance"] = load_run_glance(run.record, run.timeline)
        return super().render_change_form(request, context, *args, **kwargs)

    @admin.display(description="decision-load-result/v1")
    def record_pretty(self, obj: LoadRun) -> SafeString:
        return _pretty(obj.record)

    @admin.display(description="bounds")
    def comparisons(self, obj: LoadRun) -> SafeString | str:
        # Rounded for reading; the record below keeps every figure whole.
        return _table(
            ("bound", "observed", "limit", ""),
            (
                (row.bound, row.observed, row.limit, "pass" if row.passed else "FAIL")
                for row in load_run_bounds(obj.record)
            ),
        )

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Start a load run: pick a preregistered manifest and a target; a worker runs it."""

        def start(form: Any) -> tuple[LoadRun, str]:
            run = services.load_run_submit(
                form.cleaned_data["workspace"],
                request.user,
                form.cleaned_data["manifest"],
                form.cleaned_data["target"],
            )
            return run, f"Started {run}."

        return create_page(self, request, LoadRunStartForm, start, START_PAGE)

    @admin.action(description="Run the selected manifests and targets again", permissions=["add"])
    def run_again(self, request: HttpRequest, queryset: QuerySet[LoadRun]) -> None:
        for previous in queryset:
            try:
                run = services.load_run_submit(
                    previous.workspace, request.user, previous.manifest_name, previous.target
                )
            except REFUSALS as error:
                report_refusal(self, request, error, about=previous)
            else:
                self.message_user(request, f"Started {run}.", messages.SUCCESS)


class PendingDispatchFilter(admin.SimpleListFilter):
    """Receipts with calls in flight (pending-dispatch slots) or without."""

    title = "calls in flight"
    parameter_name = "in_flight"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "some"), ("no", "none")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Receipt]) -> QuerySet[Receipt]:
        if self.value() in ("yes", "no"):
            return selectors.receipts_in_flight(queryset, in_flight=self.value() == "yes")
        return queryset


@admin.register(Receipt)
class ReceiptAdmin(WorkspaceScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "invocation_id",
        "workspace_id",
        "state",
        "revision",
        "calls_in_flight",
        "updated_at",
    )
    list_filter = ("state", PendingDispatchFilter)
    search_fields = ("invocation_id",)
    readonly_fields = (
        "workspace_id",
        "principal_id",
        "invocation_id",
        "schema",
        "ruleset_id",
        "ruleset_digest",
        "state",
        "revision",
        "calls_in_flight",
        "created_at",
        "updated_at",
        "document_pretty",
    )
    fields = readonly_fields

    def scope(self, queryset: QuerySet[Receipt], request: HttpRequest) -> QuerySet[Receipt]:
        # Receipts name their workspace by key, as the engine does.
        visible = access.workspaces_for(request.user, access.VIEW).values("key")
        return selectors.with_pending_dispatches(queryset.filter(workspace_id__in=visible))

    @admin.display(description="calls in flight (most at once)", ordering="slot_count")
    def calls_in_flight(self, obj: Receipt) -> str:
        most = obj.document.get("maxPendingDispatches")
        now = obj.pending_dispatches
        return f"{now} ({most})" if most is not None else str(now)

    @admin.display(description="receipt document")
    def document_pretty(self, obj: Receipt) -> SafeString:
        return _pretty(obj.document)
