"""Admin forms: propose a profile document, decide a version, decide a rollback request."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.urls import reverse

from admission import access, selectors, services
from admission.core import InvalidProfileError, Profile
from admission.models import RUNBOOK_ID, Workspace
from config.untrusted_json import UntrustedJSONError, load_untrusted_json

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
            self.add_error("document", str(error))
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
