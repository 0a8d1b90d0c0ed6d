"""Admin forms: propose a profile document, decide a version, request and decide a rollback,
start a what-if run."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.conf import settings
from django.urls import reverse

from admission import access, selectors
from admission.core import InvalidProfileError, Profile
from admission.models import RUNBOOK_ID, ProfileVersion, Workspace
from admission.services import profiles as services
from console.api.untrusted_json import UntrustedJSONError, load_untrusted_json
from evaluator import qualification

MONOSPACE = (
    "font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; "
    "font-size: 13px; width: 100%; max-width: 60em;"
)


def parse_json_object(text: str, what: str) -> dict[str, Any]:
    """`text` as a JSON object, else a form error naming where the JSON broke or what it was.

    The same bounds as the API's parser: nesting depth, no NUL or lone surrogate, finite numbers.
    """
    try:
        document = load_untrusted_json(text, max_depth=settings.SLUICE_MAX_JSON_DEPTH)
    except UntrustedJSONError as error:
        raise forms.ValidationError(str(error)) from None
    if not isinstance(document, dict):
        raise forms.ValidationError(f"the {what} must be a JSON object")
    return document


def runbook_url() -> str:
    return reverse("admission:runbook", args=[RUNBOOK_ID])


class ProfileProposeForm(forms.Form):
    """A workspace and a whole profile document, validated by the core's own parser."""

    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none())
    document = forms.CharField(
        label="Profile document (JSON)",
        widget=forms.Textarea(
            attrs={"rows": 28, "spellcheck": "false", "class": "profile-json", "style": MONOSPACE}
        ),
        help_text="The whole profile: profileVersion, workspace, providers, principals.",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workspace"].queryset = selectors.workspace_list_for_user(  # type: ignore[attr-defined]
            user=user, act=access.PROPOSE
        )
        self.profile: Profile | None = None

    def clean_document(self) -> Any:
        return parse_json_object(self.cleaned_data["document"], "profile document")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        workspace = cleaned.get("workspace")
        document = cleaned.get("document")
        if workspace is None or document is None:
            return cleaned
        try:
            self.profile = services.profile_document_check(workspace, document)
        except InvalidProfileError as error:
            # Every problem of the document, each naming its field.
            for reason in error.reasons():
                self.add_error("document", reason)
            return cleaned
        existing = selectors.profile_version_get(
            workspace=workspace, label=self.profile.profile_version
        )
        if existing is not None:
            if existing.profile_digest == self.profile.profile_digest:
                self.add_error("document", f"{existing} was already proposed with these limits")
            else:
                self.add_error(
                    "document",
                    f"profileVersion {existing.profile_version!r} already exists with other "
                    "limits; publish the change under a new profileVersion",
                )
        return cleaned


def suggest_label(label: str, taken: set[str]) -> str:
    """The next free label after ``label``: a trailing number counts up (demo-v1 → demo-v2),
    otherwise ``-2``, ``-3``… is appended."""
    match = re.fullmatch(r"(.*?)(\d+)", label)
    stem, number = (match.group(1), int(match.group(2))) if match else (f"{label}-", 1)
    width = len(match.group(2)) if match else 1
    while True:
        number += 1
        candidate = f"{stem}{number:0{width}d}"
        if candidate not in taken:
            return candidate


def initial_proposal(form: ProfileProposeForm, workspace_key: str | None) -> dict[str, Any]:
    """Start a proposal from the current version of the chosen workspace (or of the only one
    the operator sees), under the next free label; nothing when there is none."""
    visible = form.fields["workspace"].queryset  # type: ignore[attr-defined]
    workspace = None
    if workspace_key:
        workspace = visible.filter(pk=workspace_key).first() if workspace_key.isdigit() else None
    elif visible.count() == 1:
        workspace = visible.first()
    if workspace is None:
        return {}
    current = selectors.workspace_current_version(workspace=workspace)
    if current is None:
        return {"workspace": workspace}
    taken = set(
        selectors.profile_version_list(workspace=workspace).values_list(
            "profile_version", flat=True
        )
    )
    document = {**current.document, "profileVersion": suggest_label(current.profile_version, taken)}
    return {"workspace": workspace, "document": json.dumps(document, indent=2)}


class ProfileDecisionForm(forms.Form):
    """Answers to the runbook checklist and a comment; approval needs every answer confirmed."""

    comment = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), required=False)

    def __init__(self, *args: Any, decision: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decision = decision
        approving = decision == "approve"
        for key, question in services.RUNBOOK_CHECKLIST:
            self.fields[f"check_{key}"] = forms.BooleanField(
                label=question, required=approving, help_text=key
            )
        self.fields["comment"].required = not approving
        # Comment last, after the checklist questions.
        self.order_fields([*(f"check_{key}" for key, _ in services.RUNBOOK_CHECKLIST), "comment"])

    @property
    def runbook_id(self) -> str:
        return RUNBOOK_ID

    @property
    def runbook_url(self) -> str:
        return runbook_url()

    def checklist_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in self.fields if name.startswith("check_")]

    def checklist(self) -> dict[str, bool]:
        return {
            key: bool(self.cleaned_data.get(f"check_{key}"))
            for key, _ in services.RUNBOOK_CHECKLIST
        }


class RollbackDecisionForm(forms.Form):
    """A comment on a rollback decision; a rejection must say why."""

    comment = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), required=False)

    def __init__(self, *args: Any, decision: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decision = decision
        self.fields["comment"].required = decision == "reject"


class RollbackRequestForm(forms.Form):
    """Why the workspace should go back to an earlier version; kept on the rollback request."""

    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Shown to the approver and kept with the rollback on the ledger.",
    )

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"].strip()
        if not reason:
            raise forms.ValidationError("say why the workspace should roll back")
        return reason


class WhatIfForm(forms.Form):
    """Which manifest to run against a version's limits, on which offline target, and how the
    manifest's principal and provider ids map onto the version's."""

    manifest = forms.ChoiceField(choices=())
    target = forms.ChoiceField(choices=())
    mapping = forms.CharField(
        required=False,
        label="Id mapping (JSON, optional)",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "style": MONOSPACE}),
        help_text='{"principals": {"noisy": "ID"}, "providers": {"jev": "ID"}}. Unmapped ids '
        "the version also has map to themselves, the rest by position "
        "(docs/load-qualification.md).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        names = qualification.what_if_manifest_names()
        self.fields["manifest"].choices = [(name, name) for name in names]  # type: ignore[attr-defined]
        self.fields["target"].choices = [(n, n) for n in qualification.WHAT_IF_TARGETS]  # type: ignore[attr-defined]

    def clean_mapping(self) -> dict[str, Any] | None:
        text = self.cleaned_data["mapping"].strip()
        return parse_json_object(text, "mapping") if text else None


# ------------------------------------------------------------------ rollout controls


class KillSwitchForm(forms.Form):
    """Turn bounded parallel scheduling off (a reason is required) or allow it again."""

    enabled = forms.TypedChoiceField(
        choices=[("false", "Off: serial, one permit"), ("true", "Allowed")],
        coerce=lambda value: value == "true",
        widget=forms.HiddenInput,
    )
    reason = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why; required to turn it off. Runs in flight keep their setting.",
    )


def _candidates(workspace: Workspace) -> Any:
    """Approved versions of the workspace that are not current: what may shadow or canary."""
    current = selectors.workspace_current_version(workspace=workspace)
    versions = selectors.profile_version_list(workspace=workspace).filter(
        approvals__decision="approve"
    )
    if current is not None:
        versions = versions.exclude(pk=current.pk)
    return versions


class _VersionChoiceForm(forms.Form):
    version = forms.ModelChoiceField(queryset=ProfileVersion.objects.none(), empty_label=None)
    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args: Any, workspace: Workspace, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["version"].queryset = _candidates(workspace)  # type: ignore[attr-defined]
        self.fields["version"].label_from_instance = lambda v: v.profile_version  # type: ignore[attr-defined]


class ShadowStartForm(_VersionChoiceForm):
    """An approved version to decide every request again in dry run."""


class CanaryStartForm(_VersionChoiceForm):
    """An approved, never-active version for named principals and/or a fraction of runs."""

    principals = forms.CharField(
        required=False,
        help_text="Principal ids whose runs all use the canary, separated by commas or spaces.",
    )
    fraction = forms.FloatField(
        required=False,
        min_value=0.0,
        max_value=1.0,
        help_text="A share of the other runs, above 0 and below 1 (say 0.1), chosen by "
        "invocation id so a run always lands on the same side.",
    )

    def clean_principals(self) -> list[str]:
        text = self.cleaned_data.get("principals") or ""
        return [part for part in re.split(r"[,\s]+", text) if part]


class RolloutCloseForm(forms.Form):
    """Stop a shadow, promote or abandon a canary: the reason goes on the audit."""

    reason = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
