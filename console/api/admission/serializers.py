"""API representations; record fields keep the camelCase names of the JSON interchange."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

from admission import selectors
from admission.models import (
    CHANGE_RECORD_SCHEMA,
    ProfileApproval,
    ProfileChangeRecord,
    ProfileVersion,
    RollbackRequest,
    Workspace,
)


class WorkspaceSerializer(serializers.ModelSerializer):
    currentProfileVersion = serializers.CharField(
        source="current_profile_version", read_only=True, allow_null=True
    )
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = Workspace
        fields = ("key", "name", "currentProfileVersion", "createdAt")


class ProfileApprovalSerializer(serializers.ModelSerializer):
    approver = serializers.CharField(source="approver.username", read_only=True)
    decidedAt = serializers.DateTimeField(source="decided_at", read_only=True)
    checklist = serializers.DictField(child=serializers.BooleanField(), read_only=True)

    class Meta:
        model = ProfileApproval
        fields = ("decision", "approver", "runbook", "checklist", "comment", "decidedAt")


class ProfileVersionSerializer(serializers.ModelSerializer):
    workspaceId = serializers.CharField(source="workspace.key", read_only=True)
    profileVersion = serializers.CharField(source="profile_version", read_only=True)
    profileDigest = serializers.CharField(source="profile_digest", read_only=True)
    proposedBy = serializers.CharField(source="proposed_by.username", read_only=True)
    createdAt = serializers.DateTimeField(source="created_at", read_only=True)
    status = serializers.SerializerMethodField()
    document = serializers.JSONField(read_only=True)
    approvals = ProfileApprovalSerializer(many=True, read_only=True)

    class Meta:
        model = ProfileVersion
        fields = (
            "workspaceId",
            "profileVersion",
            "status",
            "digest",
            "profileDigest",
            "proposedBy",
            "createdAt",
            "document",
            "approvals",
        )

    def get_status(self, obj: ProfileVersion) -> str:
        """proposed, approved, rejected, active or superseded."""
        return selectors.version_status(obj)


class ProfileProposeSerializer(serializers.Serializer):
    document = serializers.JSONField(
        help_text="The whole profile document: profileVersion, workspace, providers, principals; "
        "its JSON Schema is GET /api/schemas/profile.json."
    )

    def validate_document(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError("the profile document must be a JSON object")
        return value


class ChangeApprovalSerializer(serializers.ModelSerializer):
    approver = serializers.CharField(source="approver.username", read_only=True)
    decidedAt = serializers.DateTimeField(source="decided_at", read_only=True)

    class Meta:
        model = ProfileApproval
        fields = ("decision", "approver", "runbook", "decidedAt")


class ChangeRollbackSerializer(serializers.ModelSerializer):
    requestedBy = serializers.CharField(source="requested_by.username", read_only=True)

    class Meta:
        model = RollbackRequest
        fields = ("requestedBy", "reason", "comment")


class ProfileChangeRecordSerializer(serializers.ModelSerializer):
    """The `decision-admission-profile-change/v1` record plus who did it and under what approval."""

    schema = serializers.SerializerMethodField()
    workspaceId = serializers.CharField(source="workspace.key", read_only=True)
    previousProfileVersion = serializers.CharField(
        source="previous_profile_version", read_only=True, allow_null=True
    )
    profileVersion = serializers.CharField(source="profile_version", read_only=True)
    profileDigest = serializers.CharField(source="profile_digest", read_only=True)
    atEpochMs = serializers.FloatField(source="at_epoch_ms", read_only=True)
    actor = serializers.CharField(source="actor.username", read_only=True)
    approval = ChangeApprovalSerializer(read_only=True)
    rollbackRequest = ChangeRollbackSerializer(
        source="rollback_request", read_only=True, allow_null=True
    )

    class Meta:
        model = ProfileChangeRecord
        fields = (
            "id",
            "schema",
            "workspaceId",
            "kind",
            "previousProfileVersion",
            "profileVersion",
            "digest",
            "profileDigest",
            "atEpochMs",
            "at",
            "actor",
            "approval",
            "rollbackRequest",
        )

    def get_schema(self, obj: ProfileChangeRecord) -> str:
        return CHANGE_RECORD_SCHEMA

    def to_representation(self, instance: ProfileChangeRecord) -> dict[str, Any]:
        # History pages hold hundreds of records: built directly, the declared fields above
        # still describe the schema and a test keeps both representations equal.
        moment = _TIMESTAMP.to_representation
        approval = instance.approval
        rollback = instance.rollback_request
        return {
            "id": instance.id,
            "schema": CHANGE_RECORD_SCHEMA,
            "workspaceId": str(instance.workspace.key),
            "kind": str(instance.kind),
            "previousProfileVersion": (
                None
                if instance.previous_profile_version is None
                else str(instance.previous_profile_version)
            ),
            "profileVersion": str(instance.profile_version),
            "digest": str(instance.digest),
            "profileDigest": str(instance.profile_digest),
            "atEpochMs": float(instance.at_epoch_ms),
            "at": moment(instance.at),
            "actor": str(instance.actor.username),
            "approval": None
            if approval is None
            else {
                "decision": str(approval.decision),
                "approver": str(approval.approver.username),
                "runbook": str(approval.runbook),
                "decidedAt": moment(approval.decided_at),
            },
            "rollbackRequest": None
            if rollback is None
            else {
                "requestedBy": str(rollback.requested_by.username),
                "reason": str(rollback.reason),
                "comment": str(rollback.comment),
            },
        }


# One stateless field formats every timestamp of a history page the way DRF's fields do.
_TIMESTAMP = serializers.DateTimeField()


class ErrorSerializer(serializers.Serializer):
    """The one error shape of the API (console.api.errors)."""

    error = inline_serializer(
        name="ErrorBody",
        fields={
            "type": serializers.CharField(),
            "detail": serializers.CharField(required=False),
            "fields": serializers.DictField(
                child=serializers.ListField(child=serializers.CharField()), required=False
            ),
        },
    )
