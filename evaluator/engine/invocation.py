"""``DecisionEvaluationRequest``: a ruleset, its input, the caller's ceilings and the trusted scope.

The principal and workspace ids are supplied by the host (its authenticated caller), never read
from the request document, the input or a model's answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from admission.core import InvalidProfileError, Profile
from evaluator.engine import parsing
from evaluator.engine.errors import InvalidDefinitionError
from evaluator.engine.rulesets import Ruleset

__all__ = ["DecisionEvaluationRequest", "SchedulerOptions"]

MAX_CONCURRENCY = 10_000
MAX_DEADLINE_MS = 7 * 86_400_000
MAX_INPUT_BYTES = 1_048_576
_HOST_SUPPLIED = ("principal", "principalId", "workspace", "workspaceId")


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    """How the adapter calls of one evaluation are scheduled.

    ``enabled`` false (the default) runs decisions strictly one after another. When true, at
    most ``min`` of the binding, caller, graph, principal, workspace and provider concurrency
    ceilings run at once. ``profile`` is an admission profile to register for the workspace
    before the run (hosts that build a policy per request); ``profile_version`` pins the run to
    the revision it was planned against. Without ``profile`` the workspace's registered profile
    applies.
    """

    enabled: bool = False
    binding_concurrency: int = 1
    profile: Profile | None = None
    profile_version: str | None = None

    def __post_init__(self) -> None:
        parsing.boolean(self.enabled, "scheduler.enabled")
        parsing.integer(
            self.binding_concurrency,
            "scheduler.bindingConcurrency",
            minimum=1,
            maximum=MAX_CONCURRENCY,
        )
        if self.profile is not None and not isinstance(self.profile, Profile):
            raise InvalidDefinitionError("scheduler.profile", "must be a Profile")
        if self.profile_version is not None:
            parsing.identifier(self.profile_version, "scheduler.profileVersion")
            if self.profile is not None and self.profile.profile_version != self.profile_version:
                raise InvalidDefinitionError(
                    "scheduler.profileVersion", "differs from scheduler.profile.profileVersion"
                )

    @classmethod
    def from_dict(
        cls, doc: Any, *, workspace_id: str, where: str = "scheduler"
    ) -> SchedulerOptions:
        """Parse ``{enabled?, bindingConcurrency?, profile?, profileVersion?}``; a ``profile``
        document is read for the trusted ``workspace_id``."""
        doc = parsing.mapping(doc, where)
        parsing.known_keys(
            doc, ("enabled", "bindingConcurrency", "profile", "profileVersion"), where
        )
        enabled = parsing.boolean(doc.get("enabled", False), f"{where}.enabled")
        binding = parsing.integer(
            doc.get("bindingConcurrency", 1),
            f"{where}.bindingConcurrency",
            minimum=1,
            maximum=MAX_CONCURRENCY,
        )
        profile = None
        if doc.get("profile") is not None:
            try:
                profile = Profile.from_dict(doc["profile"], workspace_id=workspace_id)
            except InvalidProfileError as error:
                raise InvalidDefinitionError(
                    f"{where}.profile.{error.field}", error.problem
                ) from None
        version = doc.get("profileVersion")
        if version is not None:
            version = parsing.identifier(version, f"{where}.profileVersion")
            if profile is not None and profile.profile_version != version:
                raise InvalidDefinitionError(
                    f"{where}.profileVersion", "differs from the profile's profileVersion"
                )
        return cls(
            enabled=enabled, binding_concurrency=binding, profile=profile, profile_version=version
        )


@dataclass(frozen=True, slots=True)
class DecisionEvaluationRequest:
    """Everything one evaluation needs. Build it with ``from_dict`` or directly; both validate.

    ``deadline_ms`` is the total time the evaluation may take, from its start. ``signal`` is the
    caller's ``CancelSignal``. ``invocation_id`` names the invocation (its admission budget and
    its receipt); a fresh one is made when absent, and a resumed run passes the original one.
    """

    ruleset: Ruleset
    input: Mapping[str, Any]
    principal_id: str
    workspace_id: str
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    caller_concurrency: int | None = None
    graph_concurrency: int | None = None
    deadline_ms: float | None = None
    invocation_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    signal: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.ruleset, Ruleset):
            raise InvalidDefinitionError("ruleset", "must be a Ruleset")
        if not isinstance(self.scheduler, SchedulerOptions):
            raise InvalidDefinitionError("scheduler", "must be SchedulerOptions")
        parsing.identifier(self.principal_id, "principal.id")
        parsing.identifier(self.workspace_id, "workspace.id")
        parsing.identifier(self.invocation_id, "invocationId")
        for name, value in (
            ("callerConcurrency", self.caller_concurrency),
            ("graphConcurrency", self.graph_concurrency),
        ):
            if value is not None:
                parsing.integer(value, name, minimum=1, maximum=MAX_CONCURRENCY)
        if self.deadline_ms is not None:
            parsing.number(self.deadline_ms, "deadlineMs", minimum=1, maximum=MAX_DEADLINE_MS)
        profile = self.scheduler.profile
        if profile is not None and profile.workspace_id != self.workspace_id:
            raise InvalidDefinitionError(
                "scheduler.profile", "belongs to another workspace than the trusted one"
            )
        _check_input(self.input)
        for index, decision in enumerate(self.ruleset.decisions):
            missing = [name for name in decision.placeholders if name not in self.input]
            if missing:
                raise InvalidDefinitionError(
                    f"ruleset.decisions[{index}].prompt", f"refers to missing input {missing[0]!r}"
                )

    @classmethod
    def from_dict(
        cls,
        doc: Any,
        *,
        principal_id: str,
        workspace_id: str,
        signal: Any = None,
    ) -> DecisionEvaluationRequest:
        """Parse a request document. ``principal_id`` and ``workspace_id`` come from the host;
        a document that tries to name them is refused."""
        doc = parsing.mapping(doc, "")
        for key in _HOST_SUPPLIED:
            if key in doc:
                raise InvalidDefinitionError(key, "is supplied by the host, not by the request")
        parsing.known_keys(
            doc,
            (
                "ruleset",
                "input",
                "scheduler",
                "callerConcurrency",
                "graphConcurrency",
                "deadlineMs",
                "invocationId",
            ),
            "",
        )
        ruleset = Ruleset.from_dict(parsing.required(doc, "ruleset", ""), "ruleset")
        values = parsing.mapping(doc.get("input", {}), "input")
        scheduler = SchedulerOptions.from_dict(doc.get("scheduler", {}), workspace_id=workspace_id)
        ceilings = {}
        for key in ("callerConcurrency", "graphConcurrency"):
            if doc.get(key) is not None:
                ceilings[key] = parsing.integer(doc[key], key, minimum=1, maximum=MAX_CONCURRENCY)
        deadline = doc.get("deadlineMs")
        if deadline is not None:
            deadline = parsing.number(deadline, "deadlineMs", minimum=1, maximum=MAX_DEADLINE_MS)
        extra: dict[str, Any] = {}
        if doc.get("invocationId") is not None:
            extra["invocation_id"] = parsing.identifier(doc["invocationId"], "invocationId")
        return cls(
            ruleset=ruleset,
            input=dict(values),
            principal_id=principal_id,
            workspace_id=workspace_id,
            scheduler=scheduler,
            caller_concurrency=ceilings.get("callerConcurrency"),
            graph_concurrency=ceilings.get("graphConcurrency"),
            deadline_ms=deadline,
            signal=signal,
            **extra,
        )

    def __repr__(self) -> str:
        # Trusted identities and the input stay out of reprs that reach logs.
        return (
            f"DecisionEvaluationRequest(ruleset={self.ruleset.id!r}, "
            f"decisions={len(self.ruleset.decisions)}, invocation_id={self.invocation_id!r}, "
            f"scheduler_enabled={self.scheduler.enabled!r})"
        )


def _check_input(values: Any) -> None:
    values = parsing.mapping(values, "input")
    try:
        encoded = json.dumps(values, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidDefinitionError("input", f"must be JSON data ({error})") from None
    if len(encoded.encode()) > MAX_INPUT_BYTES:
        raise InvalidDefinitionError("input", f"must be at most {MAX_INPUT_BYTES} bytes as JSON")
