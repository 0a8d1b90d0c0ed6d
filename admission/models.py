"""Workspaces, immutable profile versions, approvals, rollback requests and the change ledger."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models import F, Q

RUNBOOK_ID = "RUN-JEV-ADMISSION-v1"
CHANGE_RECORD_SCHEMA = "decision-admission-profile-change/v1"


class ImmutableRecordError(RuntimeError):
    """An append-only row was asked to change or disappear."""


class AppendOnlyQuerySet(models.QuerySet):
    """Refuses bulk writes that would rewrite or erase audit rows."""

    def update(self, **kwargs: Any) -> int:
        raise ImmutableRecordError(f"{self.model.__name__} rows are immutable")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise ImmutableRecordError(f"{self.model.__name__} rows cannot be deleted")

    def bulk_update(self, objs: Any, fields: Any, batch_size: int | None = None) -> int:
        raise ImmutableRecordError(f"{self.model.__name__} rows are immutable")

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise ImmutableRecordError(f"{self.model.__name__} rows are immutable")


class AppendOnlyModel(models.Model):
    """Rows are inserted once and never saved again nor deleted."""

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRecordError(f"{type(self).__name__} {self.pk} is immutable")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ImmutableRecordError(f"{type(self).__name__} rows cannot be deleted")


class Workspace(models.Model):
    """A tenant; `key` is the trusted `workspace_id` the admission core is keyed by."""

    key = models.SlugField(
        max_length=64,
        unique=True,
        help_text="Trusted workspace identity used as the admission core's workspace_id.",
    )
    name = models.CharField(max_length=200)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL,
        through="WorkspaceMembership",
        related_name="admission_workspaces",
        blank=True,
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("key",)

    def __str__(self) -> str:
        return self.key


class WorkspaceMembership(models.Model):
    """A user's role in one workspace; `admission.access` says what each role may do."""

    class Role(models.TextChoices):
        VIEWER = "viewer", "Viewer: reads the workspace"
        MEMBER = "member", "Member: also submits evaluations"
        PROPOSER = "proposer", "Proposer: also proposes profile versions"
        APPROVER = "approver", "Approver: also approves and rejects (others' work only)"
        OPERATOR = "operator", "Operator: also activates, requests rollbacks, runs load tests"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workspace_memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        # The table the plain many-to-many relation had before roles existed.
        db_table = "admission_workspace_members"
        unique_together = (("workspace", "user"),)
        ordering = ("workspace", "user")

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.workspace}"


class ProfileVersion(AppendOnlyModel):
    """One proposed admission profile document; the label is immutable within its workspace."""

    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="versions")
    profile_version = models.CharField(max_length=128)
    document = models.JSONField()
    digest = models.CharField(max_length=71)
    profile_digest = models.CharField(max_length=71)
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-created_at", "-id")
        default_permissions = ("add", "view")
        permissions = [
            ("approve_profileversion", "Can approve or reject profile versions"),
            ("activate_profileversion", "Can activate profile versions and request rollbacks"),
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(
                fields=["workspace", "profile_version"],
                name="admission_profileversion_label_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workspace.key}:{self.profile_version}"


class ProfileApproval(AppendOnlyModel):
    """A four-eyes decision on a profile version, taken under the runbook's checklist."""

    class Decision(models.TextChoices):
        APPROVE = "approve", "Approve"
        REJECT = "reject", "Reject"

    version = models.ForeignKey(ProfileVersion, on_delete=models.PROTECT, related_name="approvals")
    # Denormalised from the version so the four-eyes rule is a row-level CHECK.
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decision = models.CharField(max_length=16, choices=Decision.choices)
    runbook = models.CharField(max_length=64, default=RUNBOOK_ID)
    checklist = models.JSONField(default=dict, blank=True)
    comment = models.TextField(blank=True)
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-decided_at", "-id")
        default_permissions = ("view",)
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=~Q(approver=F("proposed_by")),
                name="admission_approval_four_eyes",
                violation_error_message="The approver must not be the proposer.",
            ),
            models.UniqueConstraint(fields=["version"], name="admission_approval_one_decision"),
        ]

    def __str__(self) -> str:
        return f"{self.decision} {self.version} by {self.approver}"


class RollbackRequest(models.Model):
    """A request to activate an earlier version again; it needs a second person's approval.

    Pending rows are decided once (a PostgreSQL trigger refuses any other change and every
    delete); decided rows never change again.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

    workspace = models.ForeignKey(
        Workspace, on_delete=models.PROTECT, related_name="rollback_requests"
    )
    target = models.ForeignKey(ProfileVersion, on_delete=models.PROTECT, related_name="+")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        null=True,
        blank=True,
    )
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at", "-id")
        default_permissions = ("add", "view")
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.UniqueConstraint(
                fields=["workspace"],
                condition=Q(status="pending"),
                name="admission_rollback_one_pending",
            ),
            models.CheckConstraint(
                condition=Q(decided_by__isnull=True) | ~Q(decided_by=F("requested_by")),
                name="admission_rollback_four_eyes",
                violation_error_message="The rollback must be decided by someone else.",
            ),
            models.CheckConstraint(
                condition=Q(status="pending", decided_by__isnull=True)
                | (~Q(status="pending") & Q(decided_by__isnull=False)),
                name="admission_rollback_decided_has_decider",
            ),
        ]

    def __str__(self) -> str:
        return f"rollback to {self.target} ({self.status})"


class ProfileChangeRecord(AppendOnlyModel):
    """The durable `decision-admission-profile-change/v1` ledger; its order is activation order."""

    class Kind(models.TextChoices):
        INITIAL = "initial", "Initial"
        CHANGE = "change", "Change"
        ROLLBACK = "rollback", "Rollback"

    workspace = models.ForeignKey(
        Workspace, on_delete=models.PROTECT, related_name="change_records"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    version = models.ForeignKey(ProfileVersion, on_delete=models.PROTECT, related_name="+")
    previous_version = models.ForeignKey(
        ProfileVersion, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    # NULL, not "", for an initial record: the JSON record carries null there.
    previous_profile_version = models.CharField(  # noqa: DJ001
        max_length=128, null=True, blank=True
    )
    profile_version = models.CharField(max_length=128)
    digest = models.CharField(max_length=71)
    profile_digest = models.CharField(max_length=71)
    at = models.DateTimeField()
    at_epoch_ms = models.FloatField()
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    approval = models.ForeignKey(ProfileApproval, on_delete=models.PROTECT, related_name="+")
    rollback_request = models.ForeignKey(
        RollbackRequest, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )

    class Meta:
        ordering = ("-at", "-id")
        default_permissions = ("view",)
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["workspace", "-at", "-id"], name="admission_change_ws_at"),
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=Q(kind="initial", previous_version__isnull=True)
                | (~Q(kind="initial") & Q(previous_version__isnull=False)),
                name="admission_change_previous_matches_kind",
            ),
            models.CheckConstraint(
                condition=~Q(kind="rollback") | Q(rollback_request__isnull=False),
                name="admission_change_rollback_has_request",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.previous_profile_version} -> {self.profile_version}"

    def to_dict(self) -> dict[str, Any]:
        """The camelCase record, field for field as the core writes it."""
        return {
            "schema": CHANGE_RECORD_SCHEMA,
            "workspaceId": self.workspace.key,
            "kind": self.kind,
            "previousProfileVersion": self.previous_profile_version,
            "profileVersion": self.profile_version,
            "digest": self.digest,
            "profileDigest": self.profile_digest,
            "atEpochMs": self.at_epoch_ms,
        }


class RolloutEvent(AppendOnlyModel):
    """One audited rollout operation in a workspace: the kill switch, a shadow, a canary.

    The rows are the state as well as the audit: the workspace's latest `parallel-*` row says
    whether bounded parallel scheduling is allowed; a `shadow-start` or `canary-start` row with no
    closing row (`session` pointing back at it) is the running shadow or canary.
    """

    class Kind(models.TextChoices):
        PARALLEL_OFF = "parallel-off", "Kill switch: bounded parallel scheduling off"
        PARALLEL_ON = "parallel-on", "Bounded parallel scheduling allowed again"
        SHADOW_START = "shadow-start", "Shadow started"
        SHADOW_STOP = "shadow-stop", "Shadow stopped"
        CANARY_START = "canary-start", "Canary started"
        CANARY_PROMOTE = "canary-promote", "Canary promoted"
        CANARY_ABANDON = "canary-abandon", "Canary abandoned"

    STARTS: ClassVar[frozenset[str]] = frozenset({"shadow-start", "canary-start"})
    CLOSES: ClassVar[frozenset[str]] = frozenset(
        {"shadow-stop", "canary-promote", "canary-abandon"}
    )

    workspace = models.ForeignKey(
        Workspace, on_delete=models.PROTECT, related_name="rollout_events"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    version = models.ForeignKey(
        ProfileVersion, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    # The start row a stop, promote or abandon closes.
    session = models.ForeignKey(
        "self", on_delete=models.PROTECT, related_name="closings", null=True, blank=True
    )
    principals = models.JSONField(default=list, blank=True)
    fraction = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-at", "-id")
        default_permissions = ("view",)
        indexes: ClassVar[list[models.Index]] = [
            models.Index(fields=["workspace", "kind", "-id"], name="admission_rollout_ws_kind"),
        ]
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=~Q(kind__in=["shadow-start", "canary-start"])
                | Q(version__isnull=False, session__isnull=True),
                name="admission_rollout_start_has_version",
            ),
            models.CheckConstraint(
                condition=~Q(kind__in=["shadow-stop", "canary-promote", "canary-abandon"])
                | Q(session__isnull=False),
                name="admission_rollout_close_has_session",
            ),
            models.CheckConstraint(
                condition=Q(fraction__isnull=True) | Q(fraction__gt=0, fraction__lte=1),
                name="admission_rollout_fraction_range",
            ),
            # A shadow or canary is closed once.
            models.UniqueConstraint(
                fields=["session"],
                condition=Q(session__isnull=False),
                name="admission_rollout_closed_once",
            ),
        ]

    def __str__(self) -> str:
        label = f" {self.version.profile_version}" if self.version is not None else ""
        return f"{self.kind}{label} in {self.workspace.key}"


class ShadowObservation(AppendOnlyModel):
    """What one evaluation run's admission decisions were, and would have been under the shadow.

    `active` and `shadow` are tallies (`admission.core.shadow.Tally.to_dict`) of the same
    requests; `run_id` names the evaluation run that produced them.
    """

    session = models.ForeignKey(RolloutEvent, on_delete=models.PROTECT, related_name="observations")
    run_id = models.CharField(max_length=64, blank=True)
    active = models.JSONField()
    shadow = models.JSONField()
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("at", "id")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"shadow observation {self.pk} of session {self.session_id}"


class RunBoundary(AppendOnlyModel):
    """What an evaluation run started under, kept at its first start so that a redelivered run
    (a worker died) finishes under the same kill-switch setting and canary arm."""

    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="+")
    run_id = models.CharField(max_length=64, unique=True)
    parallel_allowed = models.BooleanField()
    canary = models.ForeignKey(
        RolloutEvent, on_delete=models.PROTECT, related_name="+", null=True, blank=True
    )
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"run {self.run_id} started in {self.workspace_id}"


class AdmissionSnapshot(models.Model):
    """The live admission figures a worker process published (admission/runtime/live.py), for a
    worker whose admission is kept in its own process: one row per process, rewritten every few
    seconds. `state` maps workspace keys to figures in the shape of the shared state in Redis;
    it holds counts by provider, decision and reason, never a principal id."""

    process_id = models.CharField(primary_key=True, max_length=160)
    written_at = models.DateTimeField(db_index=True)
    state = models.JSONField(default=dict)

    class Meta:
        ordering = ("-written_at",)

    def __str__(self) -> str:
        return f"admission snapshot of {self.process_id}"
