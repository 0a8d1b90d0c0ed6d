"""Admin workflow for profiles: propose, decide, activate, roll back; audit rows read-only.

Every write goes through `admission.services.profiles` (what-if runs through
`evaluator.services.runs`); the admin only renders forms and reports. Every list, page, action
and form shows and offers only the workspaces the signed-in user belongs to, with the role the
act needs (`admission.access`); workspaces and their memberships are managed by superusers.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from admission import access, selectors
from admission.models import (
    RUNBOOK_ID,
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
    RolloutEvent,
    Workspace,
    WorkspaceMembership,
)
from admission.rollout.profile_diff import LimitRow, limit_rows, limits_diff, zero_limit_count
from admission.services import profiles as services
from admission.services import rollout
from console.admin.kit import REFUSALS, admin_page, form_refusal, report_refusal
from console.charts.load_runs import load_run_bounds, load_run_glance
from console.forms.profiles import (
    ProfileDecisionForm,
    ProfileProposeForm,
    RollbackDecisionForm,
    RollbackRequestForm,
    WhatIfForm,
    initial_proposal,
    runbook_url,
)
from console.templatetags.readable import readable_number
from evaluator import comparisons
from evaluator import selectors as evaluator_selectors
from evaluator.models import LoadRun
from evaluator.services.runs import load_run_submit

# The site's own name on every admin page (and the browser tab), not Django's.
admin.site.site_header = "Sluice"
admin.site.site_title = "Sluice"
admin.site.index_title = "Operations"


def _operator(request: HttpRequest) -> Any:
    """The signed-in admin user; the admin site only lets authenticated staff this far."""
    user = request.user
    if not isinstance(user, get_user_model()):
        raise PermissionDenied
    return user


# Review pages summarise big documents: a line diff, the whole JSON inline and the limit rows
# stop at these sizes, and the rest is a click away (the limits page with search, the JSON).
DIFF_MAX_CHARS = 65_536
INLINE_JSON_CHARS = 65_536
REVIEW_ROWS = 100
DECISION_ROWS = 25
DECISION_MAX_VERSIONS = 10
LIMITS_PAGE_ROWS = 100


def pretty_json(document: Any) -> str:
    """A document as the admin shows it: indented, keys sorted, non-ASCII text kept."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)


def json_block(document: Any, **attributes: str) -> SafeString:
    """`pretty_json` in an escaped <pre> with the given attributes; a dash when there is none."""
    if document is None:
        return format_html("<pre>{}</pre>", "—")
    shown = format_html_join("", ' {}="{}"', sorted(attributes.items()))
    return format_html("<pre{}>{}</pre>", shown, pretty_json(document))


def document_html(version: ProfileVersion) -> SafeString:
    """A version's document inline when it is small; otherwise its size and links to the whole
    JSON and to its limits with search."""
    size = len(json.dumps(version.document))  # the C encoder: indenting is many times slower
    if size <= INLINE_JSON_CHARS:
        return json_block(version.document, **{"class": "profile-json"})
    document = version.document if isinstance(version.document, dict) else {}
    principals = document.get("principals")
    return format_html(
        '<p class="profile-json-summary">{} characters, {} principals: '
        '<a href="{}">the whole document (JSON)</a>, '
        '<a href="{}?all=1">every limit, with search</a>.</p>',
        size,
        len(principals) if isinstance(principals, dict | list) else 0,
        reverse("admin:admission_profileversion_document", args=[version.pk]),
        reverse("admin:admission_profileversion_limits", args=[version.pk]),
    )


def profile_diff_html(old: ProfileVersion | None, new_document: Any, new_label: str) -> SafeString:
    """A unified diff of two documents (keys sorted), as a <pre> block with marked lines."""
    sizes = [len(json.dumps(doc)) for doc in (old.document if old else {}, new_document)]
    if sum(sizes) > DIFF_MAX_CHARS:
        # A line diff of big documents costs seconds; the limits table lists every change.
        return format_html(
            '<p class="profile-diff-summary">{} and {} characters of JSON: too long for a line '
            "diff here. The limits table lists every changed limit.</p>",
            *sizes,
        )
    old_text = pretty_json(old.document).splitlines() if old is not None else []
    new_text = pretty_json(new_document).splitlines()
    lines = list(
        difflib.unified_diff(
            old_text,
            new_text,
            fromfile=old.profile_version if old is not None else "(no current version)",
            tofile=new_label,
            lineterm="",
        )
    )
    if not lines:
        return format_html('<pre class="profile-diff">{}</pre>', "(no difference)")
    classes = {"+": "diff-add", "-": "diff-del", "@": "diff-hunk"}
    body = format_html_join(
        "\n",
        '<span class="{}">{}</span>',
        ((classes.get(line[:1], "diff-ctx"), line) for line in lines),
    )
    return format_html('<pre class="profile-diff">{}</pre>', body)


class NoEditAdminMixin:
    """Rows that only services write: viewable, never changed or deleted from the admin."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)  # type: ignore[misc]
        actions.pop("delete_selected", None)
        return actions


class ReadOnlyAdminMixin(NoEditAdminMixin):
    """Audit rows: viewable, never added, changed or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WorkspaceScopedAdminMixin:
    """Rows of the workspaces the signed-in user may view, and nothing else.

    `workspace_lookup` is the path from a row to its workspace; `add_act` the act that adding a
    row needs (None: rows are never added here). An action offered because the user may do its
    act somewhere is still checked per row by the service it calls.
    """

    workspace_lookup = "workspace"
    add_act: str | None = None

    def scope(self, queryset: QuerySet[Any], request: HttpRequest) -> QuerySet[Any]:
        visible = access.workspaces_for(request.user, access.VIEW)
        return queryset.filter(**{f"{self.workspace_lookup}__in": visible})

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return self.scope(super().get_queryset(request), request)  # type: ignore[misc]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _may_anywhere(request, access.VIEW)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is None:
            return _may_anywhere(request, access.VIEW)
        return self.get_queryset(request).filter(pk=obj.pk).exists()

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.add_act is not None and _may_anywhere(request, self.add_act)

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return _may_anywhere(request, access.APPROVE)

    def has_activate_permission(self, request: HttpRequest) -> bool:
        return _may_anywhere(request, access.ACTIVATE)

    def has_what_if_permission(self, request: HttpRequest) -> bool:
        # A what-if run qualifies a proposal: whoever may propose may ask for one.
        return _may_anywhere(request, access.PROPOSE)


def _may_anywhere(request: HttpRequest, act: str) -> bool:
    return access.workspaces_for(request.user, act).exists()


WORKSPACE_FILTER = ("workspace", admin.RelatedOnlyFieldListFilter)


class VersionStatusFilter(admin.SimpleListFilter):
    """Versions by their one-word state (`selectors.version_status`)."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in selectors.VERSION_STATUSES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return selectors.profile_versions_in_status(queryset, value) if value else queryset


class WaitingForMeFilter(admin.SimpleListFilter):
    """The inbox: proposed versions the signed-in user may approve and did not propose."""

    title = "waiting for my decision"
    parameter_name = "inbox"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("me", "waiting for my decision")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() != "me":
            return queryset
        return selectors.profile_versions_awaiting(queryset, user=request.user)


def _run_per_object(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    objects: QuerySet[Any],
    operation: Callable[[Any], str],
) -> None:
    """Apply `operation` to each object; report each success and each refusal on its own."""
    for obj in objects:
        try:
            done = operation(obj)
        except REFUSALS as error:
            report_refusal(model_admin, request, error, about=obj)
        else:
            model_admin.message_user(request, done, messages.SUCCESS)


DecisionFormT = TypeVar("DecisionFormT", ProfileDecisionForm, RollbackDecisionForm)
FormT = TypeVar("FormT", bound=forms.Form)


def _form_action(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    make_form: Callable[[Any], FormT],
    perform: Callable[[FormT, Any], str],
    title: str,
    action: str,
    template: str = "admin/admission/action_form.html",
    extra: dict[str, Any] | None = None,
) -> TemplateResponse | None:
    """An admin action that asks for a form first: the form page until it validates, then
    `perform` on each object; None sends the admin back to the changelist and its messages.

    The three positional parameters are Django's action signature; the keyword-only rest say
    which form, what to do and how to title the page, so each action states them by name."""
    if "post" in request.POST:
        form = make_form(request.POST)
        if form.is_valid():
            _run_per_object(model_admin, request, queryset, partial(perform, form))
            return None
    else:
        form = make_form(None)
    return admin_page(
        model_admin,
        request,
        template,
        title=title,
        form=form,
        action=action,
        objects=list(queryset),
        action_checkbox_name=helpers.ACTION_CHECKBOX_NAME,
        **(extra or {}),
    )


def _not_your_own(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    author_field: str,
    what: str,
) -> QuerySet[Any]:
    """The objects the signed-in user may decide: each one they wrote themselves is refused at
    once, with the reason, before any checklist is shown (four-eyes rule)."""
    operator = _operator(request)
    own = [obj for obj in queryset if getattr(obj, f"{author_field}_id") == operator.pk]
    for obj in own:
        model_admin.message_user(
            request,
            f"Not offered: you {what} {obj}, so a second person must decide it "
            f"(four-eyes rule of {RUNBOOK_ID}).",
            messages.ERROR,
        )
    return queryset.exclude(pk__in=[obj.pk for obj in own]) if own else queryset


def _decision_action(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    form_class: type[DecisionFormT],
    decision: str,
    decide: Callable[[DecisionFormT, Any], str],
    title: str,
    action: str,
    extra: dict[str, Any] | None = None,
) -> TemplateResponse | None:
    """An approve/reject action: the runbook checklist page, then `decide` on each object
    (its parameters: Django's action signature, then `_form_action`'s keyword-only description
    of the page)."""
    return _form_action(
        model_admin,
        request,
        queryset,
        make_form=lambda data: form_class(data, decision=decision),
        perform=decide,
        title=title,
        action=action,
        template="admin/admission/decide.html",
        extra={
            "decision": decision,
            "runbook_url": runbook_url(),
            "runbook_id": RUNBOOK_ID,
            "form_id": "decision_form",
            "submit_id": "decision-submit",
            "submit_label": decision.capitalize(),
            **(extra or {}),
        },
    )


@dataclass(frozen=True)
class VersionReview:
    """What an approver reads about one version: its limits against the current version and
    its what-if runs."""

    version: ProfileVersion
    base: ProfileVersion | None
    # The first rows only (`rows` of them); `more` says whether others follow.
    limits: list[LimitRow]
    more: bool
    zero_count: int
    what_if_runs: list[LoadRun]


def version_review(
    version: ProfileVersion, *, rows: int, bases: dict[int, Any] | None = None
) -> VersionReview:
    """The review of `version` with its first `rows` limit rows: a big profile's thousand
    changed principals are counted on the limits page, not here. `bases` keeps each
    workspace's current version across the reviews of one page."""
    if bases is None:
        base = selectors.profile_version_diff_base(version=version)
    else:
        if version.workspace_id not in bases:
            bases[version.workspace_id] = selectors.workspace_current_version(
                workspace=version.workspace
            )
        base = bases[version.workspace_id]
        if base is not None and base.pk == version.pk:
            base = None
    found = list(
        islice(limit_rows(base.document if base is not None else None, version.document), rows + 1)
    )
    return VersionReview(
        version=version,
        base=base,
        limits=found[:rows],
        more=len(found) > rows,
        zero_count=zero_limit_count(version.document),
        what_if_runs=list(evaluator_selectors.what_if_run_list(version=version)[:3]),
    )


def limits_table_html(
    base: ProfileVersion | None, rows: list[LimitRow], *, more: bool = False, all_url: str = ""
) -> SafeString:
    """Limit rows; `more` says they are the first ones, and `all_url` where the rest are."""
    return render_to_string(
        "admin/admission/includes/limits_diff.html",
        {"base": base, "rows": rows, "more": more, "all_url": all_url},
    )


def review_limits_html(review: VersionReview) -> SafeString:
    """A review's first limit rows, with a link to every row on the version's limits page."""
    url = reverse("admin:admission_profileversion_limits", args=[review.version.pk])
    return limits_table_html(review.base, review.limits, more=review.more, all_url=url)


def what_if_html(version: ProfileVersion, runs: list[LoadRun]) -> SafeString:
    """The version's latest what-if runs: each verdict per bound, figures rounded for reading,
    and the newest completed run's charts beside the numbers they illustrate."""
    shown = []
    plotted = False
    for run in runs:
        glance = []
        if not plotted and run.status == LoadRun.Status.COMPLETED:
            glance, plotted = load_run_glance(run.record, run.timeline), True
        shown.append({"run": run, "bounds": load_run_bounds(run.record), "glance": glance})
    return render_to_string(
        "admin/admission/includes/what_if_runs.html", {"version": version, "runs": shown}
    )


class ProfileApprovalInline(admin.TabularInline):
    model = ProfileApproval
    fk_name = "version"
    extra = 0
    can_delete = False
    fields = ("decision", "approver", "runbook", "checklist", "comment", "decided_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class WorkspaceMembershipInline(admin.TabularInline):
    model = WorkspaceMembership
    extra = 0
    fields = ("user", "role")
    autocomplete_fields = ("user",)
    verbose_name = "member"
    verbose_name_plural = "members and their roles (admission.access)"


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    """Workspaces and who holds which role in them: superusers only, recorded in the admin's
    change log."""

    list_display = ("key", "name", "current_profile", "created_at")
    search_fields = ("key", "name")
    inlines = (WorkspaceMembershipInline,)

    class Media:
        css = {"all": ("admission/review.css",)}

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # The key is the core's workspace_id; renaming it would orphan the ledger's identity.
        if obj is None:
            return ("created_at",)
        return ("key", "created_at", "current_profile", "rollout_state", "current_profile_document")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_superuser)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self.has_module_permission(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="current profile")
    def current_profile(self, obj: Workspace) -> SafeString | str:
        # One query per row: a deployment has a handful of workspaces.
        version = selectors.workspace_current_version(workspace=obj)
        if version is None:
            return "none active"
        return format_html(
            '<a href="{}">{}</a> <code title="{}">{}…</code>',
            reverse("admin:admission_profileversion_change", args=[version.pk]),
            version.profile_version,
            version.profile_digest,
            version.profile_digest[7:19],
        )

    @admin.display(description="rollout")
    def rollout_state(self, obj: Workspace) -> SafeString:
        shadow = rollout.shadow_current(workspace=obj)
        canary = rollout.canary_current(workspace=obj)
        allowed = rollout.parallel_scheduling_allowed(workspace=obj)
        return format_html(
            "Parallel scheduling: <strong>{}</strong>. Shadow: <strong>{}</strong>. "
            'Canary: <strong>{}</strong>. <a href="{}">Rollout controls</a>',
            "allowed" if allowed else "off (kill switch)",
            shadow.version.profile_version if shadow and shadow.version else "none",
            canary.version.profile_version if canary and canary.version else "none",
            reverse("admin:admission_rolloutevent_controls", args=[obj.key]),
        )

    @admin.display(description="current profile document")
    def current_profile_document(self, obj: Workspace) -> SafeString:
        current = selectors.workspace_current_version(workspace=obj)
        propose = reverse("admin:admission_profileversion_add") + f"?workspace={obj.pk}"
        if current is None:
            return format_html(
                'No profile is active. <a href="{}">Propose the first one</a>.', propose
            )
        return format_html(
            '{}<a href="{}" class="button">Propose a change starting from {}</a>',
            document_html(current),
            propose,
            current.profile_version,
        )


@admin.register(ProfileVersion)
class ProfileVersionAdmin(WorkspaceScopedAdminMixin, NoEditAdminMixin, admin.ModelAdmin):
    list_display = (
        "profile_version",
        "workspace",
        "status",
        "proposed_by",
        "created_at",
        "short_profile_digest",
    )
    list_filter = (WaitingForMeFilter, VersionStatusFilter, WORKSPACE_FILTER, "created_at")
    search_fields = ("profile_version", "workspace__key")
    readonly_fields = (
        "workspace",
        "profile_version",
        "status",
        "proposed_by",
        "created_at",
        "digest",
        "profile_digest",
        "limits_table",
        "what_if_records",
        "rollout_evidence",
        "diff_to_current",
        "document_pretty",
    )
    fields = readonly_fields
    inlines = (ProfileApprovalInline,)
    actions = (
        "approve_selected",
        "reject_selected",
        "activate_selected",
        "request_rollback",
        "run_what_if",
    )
    add_act = access.PROPOSE

    class Media:
        css = {"all": ("admission/review.css",)}

    change_form_template = "admin/admission/profileversion/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProfileVersion]:
        return self.scope(selectors.profile_version_queryset(), request)

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "<int:object_id>/limits/",
                self.admin_site.admin_view(self.limits_view),
                name="admission_profileversion_limits",
            ),
            path(
                "<int:object_id>/document.json",
                self.admin_site.admin_view(self.document_view),
                name="admission_profileversion_document",
            ),
        ]
        return own + super().get_urls()

    def _viewable(self, request: HttpRequest, object_id: int) -> ProfileVersion:
        version = self.get_object(request, str(object_id))
        if version is None:
            raise Http404("No such profile version.")
        if not self.has_view_permission(request, version):
            raise PermissionDenied
        return version

    def document_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """The whole document, on demand."""
        version = self._viewable(request, object_id)
        return JsonResponse(
            version.document,
            safe=False,
            json_dumps_params={"indent": 2, "sort_keys": True, "ensure_ascii": False},
        )

    def limits_view(self, request: HttpRequest, object_id: int) -> TemplateResponse:
        """Every limit row of a version against the current one, searchable by scope, a page at
        a time (`?all=1` also lists the unchanged ones)."""
        version = self._viewable(request, object_id)
        base = selectors.profile_version_diff_base(version=version)
        everything = bool(request.GET.get("all"))
        query = request.GET.get("q", "").strip()[:128]
        rows = limits_diff(base.document if base else None, version.document, everything=everything)
        if query:
            rows = [row for row in rows if query.lower() in row.scope.lower()]
        page = Paginator(rows, LIMITS_PAGE_ROWS).get_page(request.GET.get("page"))
        return admin_page(
            self,
            request,
            "admin/admission/profileversion/limits.html",
            title=f"Limits of {version}",
            version=version,
            base=base,
            page=page,
            query=query,
            everything=everything,
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        version = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if version is not None:
            extra["version_actions"], extra["version_notes"] = self._page_actions(request, version)
            extra["version_rollout"] = selectors.version_status(
                version
            ) == "approved" and access.can(request.user, access.OPERATE, version.workspace)
        return super().change_view(request, object_id, form_url, extra)

    def _page_actions(
        self, request: HttpRequest, version: ProfileVersion
    ) -> tuple[list[tuple[str, str]], list[str]]:
        """The decisions and steps the signed-in user may take on this version now, as
        (action, label), and notes on the ones they may not take."""
        user, workspace = request.user, version.workspace
        state = selectors.version_status(version)
        offered: list[tuple[str, str]] = []
        notes: list[str] = []
        if state == "proposed" and access.can(user, access.APPROVE, workspace):
            if version.proposed_by_id == _operator(request).pk:
                notes.append(
                    "You proposed this version: a second person approves or rejects it "
                    f"(four-eyes rule of {RUNBOOK_ID})."
                )
            else:
                offered += [("approve_selected", "Approve…"), ("reject_selected", "Reject…")]
        if state == "approved" and access.can(user, access.ACTIVATE, workspace):
            offered.append(("activate_selected", "Activate"))
        if state == "superseded" and access.can(user, access.ACTIVATE, workspace):
            offered.append(("request_rollback", "Request a rollback to it…"))
        if access.can(user, access.RUN_LOAD, workspace):
            offered.append(("run_what_if", "Run a what-if…"))
        return offered, notes

    @admin.display(description="status")
    def status(self, obj: ProfileVersion) -> str:
        return selectors.version_status(obj)

    @admin.display(description="profile digest")
    def short_profile_digest(self, obj: ProfileVersion) -> str:
        return obj.profile_digest[:19] + "…"

    @admin.display(description="document")
    def document_pretty(self, obj: ProfileVersion) -> SafeString:
        return document_html(obj)

    @admin.display(description="document diff against the current version")
    def diff_to_current(self, obj: ProfileVersion) -> SafeString | str:
        if obj.pk == getattr(obj, "current_version_id", None):
            return "This is the current version."
        base = selectors.workspace_current_version(workspace=obj.workspace)
        return profile_diff_html(base, obj.document, obj.profile_version)

    @admin.display(description="limits against the current version")
    def limits_table(self, obj: ProfileVersion) -> SafeString | str:
        if obj.pk == getattr(obj, "current_version_id", None):
            return "This is the current version."
        return review_limits_html(version_review(obj, rows=REVIEW_ROWS))

    @admin.display(description="shadow and canary evidence")
    def rollout_evidence(self, obj: ProfileVersion) -> SafeString | str:
        sessions = list(
            RolloutEvent.objects.filter(version=obj, kind__in=RolloutEvent.STARTS)
            .select_related("workspace", "actor")
            .order_by("-id")[:5]
        )
        if not sessions:
            return "Never run as a shadow or a canary."
        rows = []
        for session in sessions:
            comparison = comparisons.session_comparison(session)
            if not comparison.observations:
                verdict = "nothing observed yet"
            elif comparison.passed:
                verdict = "no worse than active on every bound"
            else:
                failed = ", ".join(b.title.lower() for b in comparison.bounds if not b.passed)
                verdict = f"worse on: {failed}"
            rows.append(
                (
                    reverse("admin:admission_rolloutevent_comparison", args=[session.pk]),
                    "shadow" if session.kind == RolloutEvent.Kind.SHADOW_START else "canary",
                    session.at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M"),
                    comparison.observations,
                    verdict,
                )
            )
        return format_html(
            '<ul class="rollout-evidence">{}</ul>',
            format_html_join(
                "",
                '<li><a href="{}">{} since {} UTC</a>: {} run(s), {}</li>',
                rows,
            ),
        )

    @admin.display(description="what-if qualification")
    def what_if_records(self, obj: ProfileVersion) -> SafeString:
        return what_if_html(obj, list(evaluator_selectors.what_if_run_list(version=obj)[:5]))

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Propose a version: a JSON editor, a diff preview, and the propose service."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        diff = limits = None
        if request.method == "POST":
            form = ProfileProposeForm(request.POST, user=request.user)
            if form.is_valid():
                workspace = form.cleaned_data["workspace"]
                document = form.cleaned_data["document"]
                if "_preview" in request.POST:
                    current = selectors.workspace_current_version(workspace=workspace)
                    diff = profile_diff_html(current, document, str(document["profileVersion"]))
                    found = list(
                        islice(
                            limit_rows(current.document if current else None, document),
                            REVIEW_ROWS + 1,
                        )
                    )
                    limits = limits_table_html(
                        current, found[:REVIEW_ROWS], more=len(found) > REVIEW_ROWS
                    )
                else:
                    try:
                        version = services.profile_version_propose(
                            workspace=workspace, document=document, proposed_by=_operator(request)
                        )
                    except REFUSALS as error:
                        form_refusal(form, error)
                    else:
                        self.log_addition(request, version, [{"added": {}}])
                        self.message_user(
                            request,
                            f"Proposed {version}. A second operator approves it under "
                            f"{RUNBOOK_ID}.",
                            messages.SUCCESS,
                        )
                        return HttpResponseRedirect(
                            reverse("admin:admission_profileversion_change", args=[version.pk])
                        )
        else:
            form = ProfileProposeForm(user=request.user)
            form.initial.update(initial_proposal(form, request.GET.get("workspace")))
        return admin_page(
            self,
            request,
            "admin/admission/profileversion/propose.html",
            title="Propose a profile version",
            form=form,
            diff=diff,
            limits=limits,
            runbook_url=runbook_url(),
            runbook_id=RUNBOOK_ID,
            **(extra_context or {}),
        )

    def _decision_page(
        self, request: HttpRequest, queryset: QuerySet[ProfileVersion], decision: str
    ) -> TemplateResponse | None:
        def decide(form: ProfileDecisionForm, version: ProfileVersion) -> str:
            comment = form.cleaned_data["comment"]
            checklist = form.checklist()
            if decision == "approve":
                services.profile_version_approve(
                    version=version,
                    approver=_operator(request),
                    checklist=checklist,
                    comment=comment,
                )
                return f"Approved {version}."
            services.profile_version_reject(
                version=version,
                approver=_operator(request),
                checklist=checklist,
                comment=comment,
            )
            return f"Rejected {version}."

        queryset = _not_your_own(self, request, queryset, "proposed_by", "proposed")
        if not queryset.exists():
            return None
        selected = queryset.count()
        if selected > DECISION_MAX_VERSIONS:
            # Each version is reviewed on the page: a bounded number keeps it quick to read.
            self.message_user(
                request,
                f"Select at most {DECISION_MAX_VERSIONS} versions to {decision} at a time "
                f"({selected} were selected).",
                messages.ERROR,
            )
            return None
        title = f"{decision.capitalize()} profile versions under {RUNBOOK_ID}"
        bases: dict[int, Any] = {}
        reviews = [version_review(v, rows=DECISION_ROWS, bases=bases) for v in queryset]
        return _decision_action(
            self,
            request,
            queryset,
            form_class=ProfileDecisionForm,
            decision=decision,
            decide=decide,
            title=title,
            action=f"{decision}_selected",
            extra={"reviews": [(r, _review_html(r)) for r in reviews]},
        )

    @admin.action(
        description="Approve selected versions (runbook checklist)", permissions=["approve"]
    )
    def approve_selected(
        self, request: HttpRequest, queryset: QuerySet[ProfileVersion]
    ) -> TemplateResponse | None:
        return self._decision_page(request, queryset, "approve")

    @admin.action(description="Reject selected versions", permissions=["approve"])
    def reject_selected(
        self, request: HttpRequest, queryset: QuerySet[ProfileVersion]
    ) -> TemplateResponse | None:
        return self._decision_page(request, queryset, "reject")

    @admin.action(description="Activate selected approved versions", permissions=["activate"])
    def activate_selected(self, request: HttpRequest, queryset: QuerySet[ProfileVersion]) -> None:
        def activate(version: ProfileVersion) -> str:
            record = services.profile_version_activate(version=version, actor=_operator(request))
            return f"Activated {version} ({record.kind})."

        # Oldest first, so several versions of one workspace activate in proposal order.
        _run_per_object(self, request, queryset.order_by("created_at", "id"), activate)

    @admin.action(
        description="Request a rollback to the selected version", permissions=["activate"]
    )
    def request_rollback(
        self, request: HttpRequest, queryset: QuerySet[ProfileVersion]
    ) -> TemplateResponse | None:
        def request_one(form: RollbackRequestForm, version: ProfileVersion) -> str:
            services.rollback_request_create(
                workspace=version.workspace,
                target=version,
                requested_by=_operator(request),
                reason=form.cleaned_data["reason"],
            )
            return f"Requested a rollback to {version}; a second operator must approve it."

        return _form_action(
            self,
            request,
            queryset,
            make_form=RollbackRequestForm,
            perform=request_one,
            title="Request a rollback",
            action="request_rollback",
            extra={
                "intro": "The rollback activates the selected version again once a second "
                "operator approves it. Say why; the reason stays on the ledger.",
                "submit_label": "Request rollback",
            },
        )

    @admin.action(
        description="Run what-if qualification (offline manifest, these limits)",
        permissions=["what_if"],
    )
    def run_what_if(
        self, request: HttpRequest, queryset: QuerySet[ProfileVersion]
    ) -> TemplateResponse | None:
        def start(form: WhatIfForm, version: ProfileVersion) -> str:
            run = load_run_submit(
                version.workspace,
                _operator(request),
                form.cleaned_data["manifest"],
                form.cleaned_data["target"],
                what_if_version=version,
                mapping=form.cleaned_data["mapping"],
            )
            return f"Started a what-if run of {version} ({run.manifest_name} → {run.target})."

        return _form_action(
            self,
            request,
            queryset,
            make_form=WhatIfForm,
            perform=start,
            title="What-if qualification",
            action="run_what_if",
            extra={
                "intro": "Runs the manifest's arrivals, service times and bounds against each "
                "selected version's limits, on a worker. The record is kept beside the version "
                "and shown on its approval page; it never counts as load evidence.",
                "submit_label": "Run what-if",
            },
        )


def _review_html(review: VersionReview) -> SafeString:
    return format_html(
        "{}{}",
        review_limits_html(review),
        what_if_html(review.version, review.what_if_runs),
    )


@admin.register(RollbackRequest)
class RollbackRequestAdmin(WorkspaceScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "workspace",
        "target",
        "status",
        "requested_by",
        "decided_by",
        "created_at",
        "decided_at",
    )
    list_filter = ("status", WORKSPACE_FILTER)
    list_select_related = ("workspace", "target__workspace", "requested_by", "decided_by")
    readonly_fields = (
        "workspace",
        "target",
        "status",
        "requested_by",
        "reason",
        "decided_by",
        "comment",
        "created_at",
        "decided_at",
    )
    fields = readonly_fields
    actions = ("approve_rollbacks", "reject_rollbacks")

    def _decision_page(
        self, request: HttpRequest, queryset: QuerySet[RollbackRequest], decision: str
    ) -> TemplateResponse | None:
        def decide(form: RollbackDecisionForm, rollback: RollbackRequest) -> str:
            comment = form.cleaned_data["comment"]
            if decision == "approve":
                record = services.rollback_request_approve(
                    request=rollback, approver=_operator(request), comment=comment
                )
                return f"Rolled {rollback.workspace} back to {record.profile_version}."
            services.rollback_request_reject(
                request=rollback, approver=_operator(request), comment=comment
            )
            return f"Rejected the rollback of {rollback.workspace}."

        queryset = _not_your_own(self, request, queryset, "requested_by", "requested")
        if not queryset.exists():
            return None
        title = f"{decision.capitalize()} rollback requests"
        return _decision_action(
            self,
            request,
            queryset,
            form_class=RollbackDecisionForm,
            decision=decision,
            decide=decide,
            title=title,
            action=f"{decision}_rollbacks",
        )

    @admin.action(
        description="Approve selected rollbacks (activates the target)", permissions=["approve"]
    )
    def approve_rollbacks(
        self, request: HttpRequest, queryset: QuerySet[RollbackRequest]
    ) -> TemplateResponse | None:
        return self._decision_page(request, queryset, "approve")

    @admin.action(description="Reject selected rollbacks", permissions=["approve"])
    def reject_rollbacks(
        self, request: HttpRequest, queryset: QuerySet[RollbackRequest]
    ) -> TemplateResponse | None:
        return self._decision_page(request, queryset, "reject")


@admin.register(ProfileApproval)
class ProfileApprovalAdmin(WorkspaceScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    workspace_lookup = "version__workspace"
    list_display = ("version", "decision", "approver", "proposed_by", "runbook", "decided_at")
    list_filter = (
        "decision",
        "runbook",
        ("version__workspace", admin.RelatedOnlyFieldListFilter),
        "decided_at",
    )
    list_select_related = ("version__workspace", "approver", "proposed_by")
    search_fields = ("version__profile_version", "version__workspace__key")
    readonly_fields = (
        "version",
        "decision",
        "approver",
        "proposed_by",
        "runbook",
        "checklist",
        "comment",
        "decided_at",
    )
    fields = readonly_fields


@admin.register(ProfileChangeRecord)
class ProfileChangeRecordAdmin(WorkspaceScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    # Compact columns, so digest, actor and approval stay readable beside both sidebars at 1280 px.
    list_display = (
        "when",
        "workspace",
        "kind",
        "change",
        "short_digest",
        "actor",
        "approved_by",
        "rollback_reason",
    )
    list_display_links = ("when",)
    list_filter = ("kind", WORKSPACE_FILTER)
    list_select_related = (
        "workspace",
        "actor",
        "approval__approver",
        "rollback_request",
    )
    search_fields = ("profile_version", "previous_profile_version", "workspace__key")
    date_hierarchy = "at"
    readonly_fields = (
        "workspace",
        "kind",
        "previous_profile_version",
        "profile_version",
        "digest",
        "profile_digest",
        "at",
        "at_epoch_ms_readable",
        "actor",
        "approval",
        "rollback_request",
        "rollback_reason",
        "record_json",
    )
    fields = readonly_fields

    @admin.display(description="at epoch ms")
    def at_epoch_ms_readable(self, obj: ProfileChangeRecord) -> str:
        # Whole milliseconds for reading; the record's JSON below keeps the fraction.
        return readable_number(round(obj.at_epoch_ms))

    @admin.display(description="at (UTC)", ordering="at")
    def when(self, obj: ProfileChangeRecord) -> str:
        return obj.at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="change")
    def change(self, obj: ProfileChangeRecord) -> str:
        return f"{obj.previous_profile_version or '—'} → {obj.profile_version}"

    @admin.display(description="digest")
    def short_digest(self, obj: ProfileChangeRecord) -> SafeString:
        # The full digest is the tooltip and the detail page's; the list shows its head.
        return format_html('<code title="{}">{}…</code>', obj.digest, obj.digest[7:19])

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The ledger is the widest list: it gives the app sidebar's width to its columns.
        context = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)

    @admin.display(description="approved by", ordering="approval__approver__username")
    def approved_by(self, obj: ProfileChangeRecord) -> str:
        return str(obj.approval.approver)

    @admin.display(description="rollback reason")
    def rollback_reason(self, obj: ProfileChangeRecord) -> SafeString | str:
        request = obj.rollback_request
        if request is None:
            return "—"
        reason = request.reason or "(none given)"
        if len(reason) <= 48:
            return reason
        return format_html('<span title="{}">{}…</span>', reason, reason[:47])

    @admin.display(description="decision-admission-profile-change/v1")
    def record_json(self, obj: ProfileChangeRecord) -> SafeString:
        return format_html("<pre>{}</pre>", json.dumps(obj.to_dict(), indent=2))


from console.admin import rollout as rollout_admin  # noqa: E402,F401  (registers the rollout pages)

# The index links the live admission dashboard (console/admin/dashboard.py, config/urls.py).
admin.site.index_template = "admin/admission/index.html"
