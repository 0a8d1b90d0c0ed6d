"""Admin pages for the rollout controls: the audit list, one controls page per workspace (kill
switch, shadow, canary) and the comparison page of a shadow or canary, with plots.

Every write calls `admission.services.rollout`; the pages render forms and report refusals as
messages.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from admission import access, selectors
from admission.models import RolloutEvent, Workspace
from admission.services import rollout
from console.admin.kit import REFUSALS, admin_page, report_refusal
from console.charts import svg as charts
from console.forms.profiles import (
    CanaryStartForm,
    KillSwitchForm,
    RolloutCloseForm,
    ShadowStartForm,
)
from console.templatetags.readable import readable_number
from evaluator import comparisons

ACTIVE_LABEL = "active"


def comparison_charts(comparison: rollout.Comparison, *, other: str) -> list[SafeString]:
    """The plots of a comparison: rejections as the requests add up, and refusals by reason."""
    plots: list[SafeString] = []
    base = "current version" if other == "canary" else ACTIVE_LABEL
    if comparison.series:
        points_active = [(0.0, 0.0), *((float(n), float(a)) for n, a, _ in comparison.series)]
        points_other = [(0.0, 0.0), *((float(n), float(s)) for n, _, s in comparison.series)]
        plots.append(
            SafeString(
                charts.line_chart(
                    [
                        charts.Series(base, points_active),
                        charts.Series(other, points_other),
                    ],
                    title=f"Rejected requests as the {comparison.series_unit} add up",
                    x_label=comparison.series_unit,
                    y_label="rejected",
                )
            )
        )
    # One chart per side with the same rows and scale, so a row's bar reads across both.
    reasons = sorted(set(comparison.active["rejected"]) | set(comparison.shadow["rejected"]))
    rows = [("admitted", "admitted"), ("deferred", "waited in a queue")]
    sides = ((base, comparison.active), (other, comparison.shadow))
    largest = max(
        [float(tally[key]) for _, tally in sides for key, _ in rows]
        + [float(tally["rejected"].get(reason, 0)) for _, tally in sides for reason in reasons]
        + [1.0]
    )
    for side, tally in sides:
        bars = [charts.Bar(title, tally[key]) for key, title in rows]
        bars += [
            charts.Bar(f"rejected: {reason}", tally["rejected"].get(reason, 0))
            for reason in reasons
        ]
        plots.append(
            SafeString(
                charts.bar_chart(
                    bars, title=f"Outcomes, {side}", value_label="requests", x_max=largest
                )
            )
        )
    return plots


@admin.register(RolloutEvent)
class RolloutEventAdmin(admin.ModelAdmin):
    """The rollout audit (read-only) and the pages where operators use the controls."""

    list_display = ("at", "workspace", "kind", "version_label", "actor", "reason", "comparison")
    list_filter = ("kind", ("workspace", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("workspace", "version", "actor")
    readonly_fields = (
        "workspace",
        "kind",
        "version",
        "session",
        "principals",
        "fraction_readable",
        "reason",
        "actor",
        "at",
    )
    fields = readonly_fields

    class Media:
        css = {"all": ("admission/review.css",)}

    # Scoped like every other admission list: the workspaces the user may view.
    def get_queryset(self, request: HttpRequest) -> Any:
        visible = access.workspaces_for(request.user, access.VIEW)
        return super().get_queryset(request).filter(workspace__in=visible)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return access.workspaces_for(request.user, access.VIEW).exists()

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is None:
            return self.has_module_permission(request)
        return self.get_queryset(request).filter(pk=obj.pk).exists()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="fraction")
    def fraction_readable(self, obj: RolloutEvent) -> str:
        return "-" if obj.fraction is None else f"{readable_number(obj.fraction * 100)}% of runs"

    @admin.display(description="version")
    def version_label(self, obj: RolloutEvent) -> str:
        return obj.version.profile_version if obj.version is not None else "—"

    @admin.display(description="comparison")
    def comparison(self, obj: RolloutEvent) -> SafeString | str:
        if obj.kind not in RolloutEvent.STARTS:
            return "—"
        url = reverse("admin:admission_rolloutevent_comparison", args=[obj.pk])
        return format_html('<a href="{}">compare</a>', url)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {
            "controls_url": reverse("admin:admission_rolloutevent_controls_index"),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    def get_urls(self) -> list[URLPattern]:
        own = [
            path(
                "controls/",
                self.admin_site.admin_view(self.controls_index),
                name="admission_rolloutevent_controls_index",
            ),
            path(
                "controls/<slug:workspace_key>/",
                self.admin_site.admin_view(self.controls_view),
                name="admission_rolloutevent_controls",
            ),
            path(
                "<int:pk>/comparison/",
                self.admin_site.admin_view(self.comparison_view),
                name="admission_rolloutevent_comparison",
            ),
        ]
        return own + super().get_urls()

    # ------------------------------------------------------------------------ pages

    def controls_index(self, request: HttpRequest) -> HttpResponse:
        workspaces = selectors.workspace_list_for_user(user=request.user, act=access.VIEW)
        if not workspaces.exists():
            raise PermissionDenied
        rows = [
            (
                workspace,
                rollout.parallel_scheduling_allowed(workspace=workspace),
                rollout.shadow_current(workspace=workspace),
                rollout.canary_current(workspace=workspace),
            )
            for workspace in workspaces
        ]
        return admin_page(
            self, request, "admin/admission/rollout/index.html", title="Rollout controls", rows=rows
        )

    def controls_view(self, request: HttpRequest, workspace_key: str) -> HttpResponse:
        workspace = selectors.workspace_get_for_user(
            user=request.user, key=workspace_key, act=access.VIEW
        )
        if workspace is None:
            raise Http404("no such workspace")
        may_operate = access.can(request.user, access.OPERATE, workspace)
        op = request.POST.get("op") if request.method == "POST" else None
        if op is not None and not may_operate:
            raise PermissionDenied
        allowed = rollout.parallel_scheduling_allowed(workspace=workspace)
        # A version's own page links here with `?version=<pk>`: its forms start on that version.
        chosen = request.GET.get("version", "")
        forms_by_op = self._forms(
            workspace,
            request.POST if op else None,
            op,
            allowed,
            chosen=chosen if chosen.isdigit() else None,
        )
        if op is not None:
            form = forms_by_op.get(op)
            if form is None:
                raise Http404("no such control")
            if form.is_valid():
                try:
                    done = self._perform(request, workspace, op, form)
                except REFUSALS as error:
                    report_refusal(self, request, error)
                else:
                    self.message_user(request, done, messages.SUCCESS)
                    return HttpResponseRedirect(request.path)
        shadow = rollout.shadow_current(workspace=workspace)
        canary = rollout.canary_current(workspace=workspace)
        return admin_page(
            self,
            request,
            "admin/admission/rollout/controls.html",
            title=f"Rollout controls of {workspace.key}",
            workspace=workspace,
            current=selectors.workspace_current_version(workspace=workspace),
            parallel_allowed=rollout.parallel_scheduling_allowed(workspace=workspace),
            shadow=shadow,
            shadow_comparison=rollout.shadow_comparison(session=shadow) if shadow else None,
            canary=canary,
            canary_comparison=comparisons.canary_comparison(canary) if canary else None,
            forms=forms_by_op,
            may_operate=may_operate,
            events=list(rollout.rollout_events(workspace=workspace)[:10]),
        )

    @staticmethod
    def _forms(
        workspace: Workspace, data: Any, op: str | None, allowed: bool, chosen: str | None = None
    ) -> dict[str, forms.Form]:
        def bound(name: str) -> Any:
            return data if op == name else None

        # The switch form flips the state the page showed.
        flip = {"enabled": "false" if allowed else "true"}
        picked = {"version": chosen} if chosen else None
        return {
            "switch": KillSwitchForm(bound("switch"), prefix="switch", initial=flip),
            "shadow_start": ShadowStartForm(
                bound("shadow_start"), prefix="shadow", workspace=workspace, initial=picked
            ),
            "shadow_stop": RolloutCloseForm(bound("shadow_stop"), prefix="shadow_stop"),
            "canary_start": CanaryStartForm(
                bound("canary_start"), prefix="canary", workspace=workspace, initial=picked
            ),
            "canary_promote": RolloutCloseForm(bound("canary_promote"), prefix="promote"),
            "canary_abandon": RolloutCloseForm(bound("canary_abandon"), prefix="abandon"),
        }

    @staticmethod
    def _perform(request: HttpRequest, workspace: Workspace, op: str, form: forms.Form) -> str:
        actor: Any = request.user
        data = form.cleaned_data
        reason = data.get("reason", "")
        if op == "switch":
            rollout.parallel_scheduling_set(
                workspace=workspace, actor=actor, allowed=data["enabled"], reason=reason
            )
            if data["enabled"]:
                return f"Bounded parallel scheduling is allowed again in {workspace.key}."
            return (
                f"Kill switch on: runs of {workspace.key} that start from now on run serially "
                "with one permit; runs in flight keep their setting."
            )
        if op == "shadow_start":
            event = rollout.shadow_start(version=data["version"], actor=actor, reason=reason)
            return f"Started {data['version'].profile_version} as the shadow (event {event.pk})."
        if op == "shadow_stop":
            rollout.shadow_stop(workspace=workspace, actor=actor, reason=reason)
            return "Stopped the shadow; its observations stay."
        if op == "canary_start":
            rollout.canary_start(
                version=data["version"],
                actor=actor,
                principals=data["principals"],
                fraction=data["fraction"],
                reason=reason,
            )
            return f"Started {data['version'].profile_version} as a canary."
        if op == "canary_promote":
            _event, record = rollout.canary_promote(workspace=workspace, actor=actor, reason=reason)
            return f"Promoted the canary: {record.profile_version} is current ({record.kind})."
        rollout.canary_abandon(workspace=workspace, actor=actor, reason=reason)
        return "Abandoned the canary: every later run uses the current version."

    def comparison_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        event = self.get_queryset(request).filter(pk=pk).first()
        if event is None or event.kind not in RolloutEvent.STARTS:
            raise Http404("no such shadow or canary")
        comparison = comparisons.session_comparison(event)
        other = "shadow" if event.kind == RolloutEvent.Kind.SHADOW_START else "canary"
        closing = event.closings.first()
        return admin_page(
            self,
            request,
            "admin/admission/rollout/comparison.html",
            title=f"{other.capitalize()} {event.version.profile_version if event.version else ''} "
            f"against the active profile",
            event=event,
            closing=closing,
            other=other,
            comparison=comparison,
            plots=comparison_charts(comparison, other=other),
        )
