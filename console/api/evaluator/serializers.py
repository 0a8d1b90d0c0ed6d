"""API representations of evaluation and load runs (camelCase, as the JSON interchange)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from evaluator import selectors
from evaluator.models import EvaluationRun, LoadRun


class RunErrorSerializer(serializers.Serializer):
    type = serializers.CharField()
    detail = serializers.CharField()
    field = serializers.CharField(required=False)


class EvaluationSubmitSerializer(serializers.Serializer):
    """A `DecisionEvaluationRequest` document (JSON Schema: GET /api/schemas/evaluation.json).
    The principal and workspace are never in it: they are the authenticated caller and the
    workspace of the URL."""

    ruleset = serializers.JSONField(help_text="The ordered ruleset: {id, decisions: [...]}.")
    input = serializers.JSONField(required=False, help_text="Values for the prompts' ${names}.")
    scheduler = serializers.JSONField(
        required=False, help_text="{enabled, bindingConcurrency, profileVersion}; no profile."
    )
    callerConcurrency = serializers.IntegerField(required=False, min_value=1)
    graphConcurrency = serializers.IntegerField(required=False, min_value=1)
    deadlineMs = serializers.FloatField(required=False, min_value=1)
    invocationId = serializers.CharField(
        required=False, help_text="Idempotency key: the same document again returns the same run."
    )


# The lifecycle and cancel fields every `WorkerRun` shares; no docstring, as the schema would
# inherit it.
class WorkerRunSerializer(serializers.ModelSerializer):
    workspaceId = serializers.CharField(source="workspace.key", read_only=True)
    taskId = serializers.CharField(source="task_id", read_only=True)
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    startedAt = serializers.DateTimeField(source="started_at", read_only=True, allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", read_only=True, allow_null=True)
    error = RunErrorSerializer(read_only=True, allow_null=True)
    cancelRequestedAt = serializers.DateTimeField(
        source="cancel_requested_at",
        read_only=True,
        allow_null=True,
        help_text="When somebody asked to cancel the run (null if nobody did).",
    )
    cancelRequestedBy = serializers.CharField(
        source="cancel_requested_by.username",
        read_only=True,
        allow_null=True,
        help_text="Who asked to cancel the run.",
    )


class EvaluationRunSummarySerializer(WorkerRunSerializer):
    principalId = serializers.CharField(source="principal_id", read_only=True)
    invocationId = serializers.CharField(source="invocation_id", read_only=True)
    rulesetId = serializers.CharField(source="ruleset_id", read_only=True)
    rulesetDigest = serializers.CharField(source="ruleset_digest", read_only=True)
    decisionCount = serializers.IntegerField(source="decision_count", read_only=True)
    profileVersion = serializers.CharField(
        source="profile_version", read_only=True, allow_null=True
    )
    # Plain strings: drf-spectacular would otherwise merge every `status` enum into one name.
    status = serializers.CharField(
        read_only=True, help_text="queued, running, " + ", ".join(sorted(EvaluationRun.TERMINAL))
    )

    class Meta:
        model = EvaluationRun
        fields: tuple[str, ...] = (
            "id",
            "workspaceId",
            "principalId",
            "invocationId",
            "rulesetId",
            "rulesetDigest",
            "decisionCount",
            "status",
            "profileVersion",
            "deliveries",
            "taskId",
            "createdAt",
            "startedAt",
            "finishedAt",
            "cancelRequestedAt",
            "cancelRequestedBy",
            "error",
        )


class InFlightAttemptSerializer(serializers.Serializer):
    decisionId = serializers.CharField()
    adapterId = serializers.CharField()
    model = serializers.CharField()
    number = serializers.IntegerField()
    evidence = serializers.JSONField(allow_null=True, help_text="Its admission evidence.")


class RunOutageSerializer(serializers.Serializer):
    refusals = serializers.DictField(
        child=serializers.IntegerField(), help_text="Refusals the outage caused, by reason."
    )
    decisionsDelayed = serializers.IntegerField(help_text="Decisions that waited for it.")
    decisionsUnanswered = serializers.IntegerField(
        help_text="Decisions whose deadline passed (or that were cancelled) while they waited."
    )
    waitedMs = serializers.FloatField(help_text="Time the run's attempts spent waiting.")


class RunProgressSerializer(serializers.Serializer):
    decisionsTotal = serializers.IntegerField()
    decisionsDone = serializers.IntegerField(help_text="Decisions that reached an outcome.")
    outcomes = serializers.DictField(
        child=serializers.IntegerField(), help_text="Decisions done per outcome status."
    )
    attempts = serializers.IntegerField(help_text="Attempts so far (sent or refused).")
    inFlight = InFlightAttemptSerializer(
        many=True, help_text="Every call dispatched and not answered yet, in ruleset order."
    )
    maxInFlight = serializers.IntegerField(
        help_text="The most calls of this run in flight at once, from its receipt."
    )
    refusals = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Admission refusals by reason over every attempt, including refusals by our "
        "own infrastructure (coordination-unavailable) that an attempt waited through.",
    )
    outage = RunOutageSerializer(
        allow_null=True,
        help_text="Null unless an outage of the deployment's own infrastructure refused some of "
        "the run's admissions.",
    )


class EvaluationRunSerializer(EvaluationRunSummarySerializer):
    """A run with its request, its progress, its result (outcomes in ruleset order, once it
    ended) and every attempt with its admission evidence (so far, while it runs)."""

    request = serializers.JSONField(source="document", read_only=True)
    progress = serializers.SerializerMethodField()
    result = serializers.JSONField(read_only=True, allow_null=True)
    attempts = serializers.SerializerMethodField()

    class Meta(EvaluationRunSummarySerializer.Meta):
        fields = (
            *EvaluationRunSummarySerializer.Meta.fields,
            "request",
            "progress",
            "result",
            "attempts",
        )

    def _progress(self, run: EvaluationRun) -> selectors.RunProgress:
        # One receipt read serves both fields.
        cached = getattr(self, "_progress_cache", None)
        if cached is None or cached[0] != run.pk:
            cached = (run.pk, selectors.evaluation_run_progress(run))
            self._progress_cache = cached
        return cached[1]

    @extend_schema_field(RunProgressSerializer)
    def get_progress(self, run: EvaluationRun) -> dict[str, Any]:
        return self._progress(run).to_dict()

    @extend_schema_field(serializers.ListField(child=serializers.JSONField()))
    def get_attempts(self, run: EvaluationRun) -> list[dict[str, Any]]:
        return self._progress(run).attempts


class LoadRunSubmitSerializer(serializers.Serializer):
    manifest = serializers.CharField(
        help_text="A preregistered manifest, e.g. load-manifest.v2.json."
    )
    target = serializers.CharField(
        help_text="admission-controller or evaluator (offline, virtual time), or staged-provider "
        "(real time, against the deployment's staged endpoint)."
    )


class WhatIfSubmitSerializer(serializers.Serializer):
    """A what-if run of the profile version in the URL: the manifest's arrivals, service times
    and bounds under the version's limits, on an offline target (virtual time)."""

    manifest = serializers.CharField(
        required=False,
        default="load-manifest.v2.json",
        help_text="A preregistered manifest with an arrival model (load-manifest.v2.json).",
    )
    target = serializers.CharField(
        required=False,
        default="admission-controller",
        help_text="admission-controller or evaluator (both offline, on virtual time).",
    )
    mapping = serializers.JSONField(
        required=False,
        default=None,
        help_text='Manifest ids onto the version\'s ids: {"principals": {"noisy": "batch"}, '
        '"providers": {"jev": "llm"}}. Ids the version shares with the manifest map to '
        "themselves; the rest in order.",
    )


class BoundVerdictSerializer(serializers.Serializer):
    bound = serializers.CharField(help_text="The manifest's bound, e.g. maxQueueDelayMs.")
    observed = serializers.JSONField(help_text="What the run observed.")
    limit = serializers.JSONField(help_text="The manifest's limit.")
    passed = serializers.BooleanField()


class LoadRunVerdictSerializer(serializers.Serializer):
    passed = serializers.BooleanField(help_text="Whether every bound held.")
    failed = serializers.ListField(
        child=serializers.CharField(), help_text="The bounds that did not hold, in record order."
    )
    bounds = BoundVerdictSerializer(many=True)


def load_run_verdict(run: LoadRun) -> dict[str, Any] | None:
    """A completed run's verdict per bound, read off its record (None before it completed)."""
    record = run.record
    if run.status != LoadRun.Status.COMPLETED or not isinstance(record, dict):
        return None
    bounds = [
        {
            "bound": item["bound"],
            "observed": item["observed"],
            "limit": item["limit"],
            "passed": bool(item["pass"]),
        }
        for item in record.get("comparisons") or []
    ]
    return {
        "passed": bool(record.get("passed")),
        "failed": [item["bound"] for item in bounds if not item["passed"]],
        "bounds": bounds,
    }


class LoadRunSerializer(WorkerRunSerializer):
    submittedBy = serializers.CharField(source="submitted_by.username", read_only=True)
    manifest = serializers.CharField(source="manifest_name", read_only=True)
    manifestDigest = serializers.CharField(source="manifest_digest", read_only=True)
    passed = serializers.BooleanField(read_only=True, allow_null=True)
    record = serializers.JSONField(
        read_only=True, allow_null=True, help_text="The decision-load-result/v1 record."
    )
    status = serializers.CharField(
        read_only=True, help_text="queued, running, " + ", ".join(sorted(LoadRun.TERMINAL))
    )
    progress = serializers.FloatField(
        read_only=True,
        allow_null=True,
        help_text="How far the harness got while it runs, 0 to 1 (null while queued).",
    )
    whatIfVersion = serializers.CharField(
        source="what_if_version.profile_version",
        read_only=True,
        allow_null=True,
        help_text="Set for a what-if run: the profile version whose limits it ran against.",
    )
    mapping = serializers.JSONField(
        read_only=True, allow_null=True, help_text="A what-if run's requested id mapping."
    )
    verdict = serializers.SerializerMethodField(
        help_text="Once completed: every bound of the record with its verdict (the record keeps "
        "the full precision)."
    )

    class Meta:
        model = LoadRun
        fields = (
            "id",
            "workspaceId",
            "submittedBy",
            "manifest",
            "target",
            "status",
            "progress",
            "manifestDigest",
            "passed",
            "deliveries",
            "taskId",
            "createdAt",
            "startedAt",
            "finishedAt",
            "cancelRequestedAt",
            "cancelRequestedBy",
            "error",
            "whatIfVersion",
            "mapping",
            "verdict",
            "record",
        )

    @extend_schema_field(LoadRunVerdictSerializer(allow_null=True))
    def get_verdict(self, run: LoadRun) -> dict[str, Any] | None:
        return load_run_verdict(run)
