"""Admin forms: submit an evaluation as yourself, start a load run."""

from __future__ import annotations

import json
from typing import Any

from django import forms

from admission import access
from admission.models import Workspace
from console.forms.profiles import MONOSPACE, parse_json_object
from evaluator import qualification
from evaluator.engine.outcomes import AttemptRecord
from evaluator.services import runs as services


def example_request(decisions: int = 10, *, adapter: str = "fake") -> dict[str, Any]:
    """A small request document: `decisions` yes/no questions answered by `adapter`."""
    return {
        "ruleset": {
            "id": "demo-screening",
            "decisions": [
                {
                    "id": f"check-{index + 1}",
                    "prompt": f"Question {index + 1}: is ${{text}} acceptable?",
                    "allowedOutputs": ["yes", "no"],
                    "binding": {
                        "primary": {"adapter": adapter, "model": "demo-model", "timeoutMs": 10000}
                    },
                }
                for index in range(decisions)
            ],
        },
        "input": {"text": "a refund of 20 EUR"},
    }


def example_attempt(**fields: Any) -> dict[str, Any]:
    """An attempt at one of `example_request`'s decisions as a run records it: the fake adapter's
    demo model answered on the first try; `fields` are further `AttemptRecord` fields (timings,
    tokens, evidence...)."""
    return AttemptRecord(
        target_index=0,
        adapter_id="fake",
        model="demo-model",
        number=1,
        sent=True,
        outcome="succeeded",
        reason="answered",
        **fields,
    ).to_dict()


class EvaluationSubmitForm(forms.Form):
    """A workspace where the operator may evaluate and a request document; the operator is the
    principal."""

    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none())
    document = forms.CharField(
        label="Request document (JSON)",
        widget=forms.Textarea(attrs={"rows": 22, "spellcheck": "false", "style": MONOSPACE}),
        help_text="ruleset, input and optional scheduler options; you are the principal.",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        kwargs.setdefault("initial", {}).setdefault(
            "document", json.dumps(example_request(3), indent=2)
        )
        super().__init__(*args, **kwargs)
        members = access.workspaces_for(user, access.EVALUATE).order_by("key")
        self.fields["workspace"].queryset = members  # type: ignore[attr-defined]
        if members.count() == 1 and "workspace" not in self.initial:
            self.initial["workspace"] = members.first()

    def clean_document(self) -> Any:
        return parse_json_object(self.cleaned_data["document"], "request document")


class LoadRunStartForm(forms.Form):
    """Which preregistered manifest to release into which target, recorded under a workspace
    where the operator may start load runs."""

    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none())
    manifest = forms.ChoiceField(choices=())
    target = forms.ChoiceField(choices=())

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workspace"].queryset = access.workspaces_for(  # type: ignore[attr-defined]
            user, access.RUN_LOAD
        ).order_by("key")
        names = services.load_manifest_names()
        self.fields["manifest"].choices = [(name, name) for name in names]  # type: ignore[attr-defined]
        self.fields["target"].choices = [(name, name) for name in qualification.TARGETS]  # type: ignore[attr-defined]
        if "load-manifest.v2.json" in names:
            self.initial.setdefault("manifest", "load-manifest.v2.json")
