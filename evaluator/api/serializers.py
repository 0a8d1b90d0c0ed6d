"""API representations of evaluation and load runs (camelCase, as the JSON interchange)."""

from __future__ import annotations

from rest_framework import serializers

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


# The lifecycle fields every `WorkerRun` shares; no docstring, as the schema would inherit it.
class WorkerRunSerializer(serializers.ModelSerializer):
    workspaceId = serializers.CharField(source="workspace.key", read_only=True)
    taskId = serializers.CharField(source="task_id", read_only=True)
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    startedAt = serializers.DateTimeField(source="started_at", read_only=True, allow_null=True)
    finishedAt = serializers.DateTimeField(source="finished_at", read_only=True, allow_null=True)
    error = RunErrorSerializer(read_only=True, allow_null=True)


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
            "error",
        )


class EvaluationRunSerializer(EvaluationRunSummarySerializer):
    """A run with its request, its result (outcomes in ruleset order) and every attempt with
    its admission evidence."""

    request = serializers.JSONField(source="document", read_only=True)
    result = serializers.JSONField(read_only=True, allow_null=True)
    attempts = serializers.JSONField(read_only=True)

    class Meta(EvaluationRunSummarySerializer.Meta):
        fields = (*EvaluationRunSummarySerializer.Meta.fields, "request", "result", "attempts")


class LoadRunSubmitSerializer(serializers.Serializer):
    manifest = serializers.CharField(
        help_text="A preregistered manifest, e.g. load-manifest.v2.json."
    )
    target = serializers.CharField(
        help_text="admission-controller or evaluator (offline, virtual time), or staged-provider "
        "(real time, against the deployment's staged endpoint)."
    )


class LoadRunSerializer(WorkerRunSerializer):
    submittedBy = serializers.CharField(source="submitted_by.username", read_only=True)
    manifest = serializers.CharField(source="manifest_name", read_only=True)
    manifestDigest = serializers.CharField(source="manifest_digest", read_only=True)
    passed = serializers.BooleanField(read_only=True, allow_null=True)
    record = serializers.JSONField(
        read_only=True, allow_null=True, help_text="The decision-load-result/v1 record."
    )
    status = serializers.CharField(read_only=True, help_text="queued, running, completed, failed")
    whatIfVersion = serializers.CharField(
        source="what_if_version.profile_version",
        read_only=True,
        allow_null=True,
        help_text="Set for a what-if run: the profile version whose limits it ran against.",
    )
    mapping = serializers.JSONField(
        read_only=True, allow_null=True, help_text="A what-if run's requested id mapping."
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
            "manifestDigest",
            "passed",
            "deliveries",
            "taskId",
            "createdAt",
            "startedAt",
            "finishedAt",
            "error",
            "whatIfVersion",
            "mapping",
            "record",
        )
