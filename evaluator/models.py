"""Database rows of the evaluator."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from django.conf import settings
from django.db import models
from django.db.models.functions import Now

from evaluator.engine.receipts import RECEIPT_SCHEMA, RECEIPT_SCHEMA_V2, pending_slots, with_slots


class Receipt(models.Model):
    """The durable receipt (v3; a v2 one until the run that resumes it upgrades it) of one
    evaluation invocation.

    ``document`` is the receipt JSON the evaluator reads and writes, except its pending-dispatch
    slots: each is a ``ReceiptSlot`` row (a v2 receipt keeps its one slot in the document). The
    other columns copy what operators filter on. Updates are compare-and-set on ``revision`` and
    stop once ``state`` leaves ``running``; slots are added only under the latest ``claim``.
    """

    class State(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        TIMEOUT = "timeout"

    workspace_id = models.CharField(max_length=128)
    principal_id = models.CharField(max_length=128)
    invocation_id = models.CharField(max_length=128)
    schema = models.CharField(max_length=64, default=RECEIPT_SCHEMA)
    ruleset_id = models.CharField(max_length=128)
    ruleset_digest = models.CharField(max_length=80)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    revision = models.PositiveIntegerField()
    # Taken anew by every run that resumes the receipt: slots are added under the latest only.
    claim = models.PositiveIntegerField(default=1)
    document = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace_id", "invocation_id"], name="evaluator_receipt_unique_invocation"
            ),
        ]
        indexes = [
            models.Index(fields=["workspace_id", "state"], name="evaluator_receipt_state"),
        ]

    def __str__(self) -> str:
        return f"receipt {self.invocation_id} ({self.state}, revision {self.revision})"

    @property
    def pending_dispatches(self) -> int:
        """How many dispatches are pending: calls sent whose outcome is not recorded yet."""
        counted = getattr(self, "slot_count", None)
        if counted is None:
            counted = self.slots.count()
        if self.document.get("schema") == RECEIPT_SCHEMA_V2:
            counted += len(pending_slots(self.document))
        return counted

    def full_document(self) -> dict[str, Any]:
        """The receipt document as the evaluator reads it: with its pending slots."""
        rows = self.slots.all()
        return with_slots(self.document, {_row_key(row): row.slot for row in rows})


class ReceiptSlot(models.Model):
    """One pending dispatch of a receipt: an attempt whose call may be at its provider.

    Added (durably) before the call starts and deleted in the transaction that records the
    attempt; one still here when a run resumes becomes that attempt's ``execution-uncertain``
    record. Slot inserts lock the receipt row only for key share, so they never wait for a
    document write of the same receipt, and the unique constraint keeps every attempt to one slot.
    """

    receipt = models.ForeignKey(Receipt, on_delete=models.CASCADE, related_name="slots")
    decision_index = models.PositiveIntegerField()
    target_index = models.PositiveIntegerField()
    number = models.PositiveIntegerField()
    slot = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["receipt", "decision_index", "target_index", "number"],
                name="evaluator_receiptslot_unique_attempt",
            ),
        ]

    def __str__(self) -> str:
        return f"slot {self.decision_index}/{self.target_index}/{self.number}"


def _row_key(row: ReceiptSlot) -> tuple[int, int, int]:
    return (row.decision_index, row.target_index, row.number)


class WorkerRun(models.Model):
    """What every run a worker executes keeps: its submitter, task, deliveries, timings, error."""

    TERMINAL: ClassVar[frozenset[str]]
    status: str

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    error = models.JSONField(null=True, blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    deliveries = models.PositiveIntegerField(default=0)
    # Stamped by the database in the INSERT (STATEMENT_TIMESTAMP() on PostgreSQL), like every
    # other time of a run (evaluator/services/server_clock.py): a web process whose clock is
    # off neither misdates a run nor moves it in the claim order. SQLite's is the process's.
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Who runs it now (evaluator/worker/runner.py, evaluator/worker/load_dispatch.py): the
    # worker's id and a fresh token per claim, which every later write of that worker must still
    # match (a run taken back and claimed again by another worker is no longer the first one's to
    # finish), and the claimant's last heartbeat.
    claimed_by = models.CharField(max_length=160, blank=True)
    claim = models.UUIDField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Who asked to cancel the run and when (set once; the worker polls for it, see
    # evaluator/worker/cancel_watch.py). NULL while nobody asked.
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        null=True,
        blank=True,
    )

    class Meta:
        abstract = True
        ordering = ("-created_at", "-id")

    @property
    def finished(self) -> bool:
        return self.status in self.TERMINAL


class EvaluationRun(WorkerRun):
    """One evaluation submitted by an authenticated member of a workspace and run by a worker.

    ``principal_id`` and ``workspace`` are the trusted identities the host supplied; the request
    document never names them. ``result`` holds the run's outcome in ruleset order (without the
    attempts) and ``attempts`` every attempt with its admission evidence, both written when the
    run ends; while it runs, its receipt (``Receipt``) holds the attempts and outcomes so far.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        EXECUTION_UNCERTAIN = "execution-uncertain"
        CANCELLED = "cancelled"
        TIMEOUT = "timeout"
        FAILED = "failed"

    TERMINAL = frozenset({"completed", "execution-uncertain", "cancelled", "timeout", "failed"})

    workspace = models.ForeignKey(
        "admission.Workspace", on_delete=models.PROTECT, related_name="evaluation_runs"
    )
    principal_id = models.CharField(max_length=128)
    invocation_id = models.CharField(max_length=128)
    document = models.JSONField()
    ruleset_id = models.CharField(max_length=128)
    ruleset_digest = models.CharField(max_length=80)
    decision_count = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.QUEUED)
    # NULL until a worker picked the run up under the workspace's then-current profile.
    profile_version = models.CharField(max_length=128, null=True, blank=True)  # noqa: DJ001
    result = models.JSONField(null=True, blank=True)
    attempts = models.JSONField(default=list, blank=True)

    class Meta(WorkerRun.Meta):
        constraints = [
            # The receipt store keys invocations by workspace; so does the run.
            models.UniqueConstraint(
                fields=["workspace", "invocation_id"], name="evaluator_run_unique_invocation"
            ),
        ]
        indexes = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="evaluator_run_ws"),
            models.Index(fields=["status"], name="evaluator_run_status"),
            # The dispatcher's fair pick: the oldest queued run of each (workspace, principal).
            models.Index(
                fields=["status", "workspace", "principal_id", "created_at"],
                name="evaluator_run_backlog",
            ),
        ]

    def __str__(self) -> str:
        return f"evaluation {self.id} ({self.status})"


class LoadRun(WorkerRun):
    """One run of a preregistered load manifest against a harness target, started by staff.

    Like an evaluation run, the `queued` row is the queue entry: a worker claims it fairly across
    workspaces, heartbeats it while it runs, and a run whose worker died is taken back.

    ``record`` is the digest-bound ``decision-load-result/v1`` record the harness produced and
    ``timeline`` the bounded series its page plots, kept beside the record, outside its digest. A
    what-if run names ``what_if_version``: the manifest's arrivals ran against that version's
    limits, with ``mapping`` (manifest id → profile id) as requested, and its record has mode
    ``what-if``, which never counts as gate evidence.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"

    TERMINAL = frozenset({"completed", "cancelled", "failed"})

    workspace = models.ForeignKey(
        "admission.Workspace", on_delete=models.PROTECT, related_name="load_runs"
    )
    manifest_name = models.CharField(max_length=128)
    target = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    manifest_digest = models.CharField(max_length=71, blank=True)
    passed = models.BooleanField(null=True, blank=True)
    record = models.JSONField(null=True, blank=True)
    what_if_version = models.ForeignKey(
        "admission.ProfileVersion",
        on_delete=models.PROTECT,
        related_name="what_if_runs",
        null=True,
        blank=True,
    )
    mapping = models.JSONField(null=True, blank=True)
    timeline = models.JSONField(null=True, blank=True)
    # How far the harness got (0 to 1) while it runs, written by the process running it.
    progress = models.FloatField(null=True, blank=True)

    class Meta(WorkerRun.Meta):
        indexes = [
            models.Index(fields=["workspace", "-created_at", "-id"], name="evaluator_loadrun_ws"),
            # The dispatcher's fair pick: the oldest queued load run of each workspace.
            models.Index(
                fields=["status", "workspace", "created_at"], name="evaluator_loadrun_backlog"
            ),
        ]

    def __str__(self) -> str:
        if self.what_if_version_id is not None:
            return f"what-if run {self.manifest_name} → {self.target} ({self.status})"
        return f"load run {self.manifest_name} → {self.target} ({self.status})"


class WorkerProcess(models.Model):
    """A worker process that runs evaluations (evaluator/worker/runner.py), while it lives.

    Its heartbeat says it is alive; `coordinated` says whether its admission limits are shared
    through Redis. A process that keeps admission to itself refuses to start beside another
    live one, since each would enforce the limits on its own (together, twice the limits).
    """

    id = models.CharField(primary_key=True, max_length=160)
    hostname = models.CharField(max_length=128)
    pid = models.PositiveIntegerField()
    # The process's start time in clock ticks (Linux /proc), so a reused pid is not mistaken.
    pid_started = models.BigIntegerField(null=True, blank=True)
    coordinated = models.BooleanField()
    slots = models.PositiveIntegerField()
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-started_at",)

    def __str__(self) -> str:
        return f"worker {self.id}"


class UsageFigures(models.Model):
    """What one principal's evaluations used of one provider in one workspace over a period
    (evaluator/services/usage.py): calls sent, the actual tokens and cost reconciled with
    admission, admission decisions by reason and queue delay. Principal ids appear here and in the
    workspace's own access-controlled pages, never in metrics."""

    provider_id = models.CharField(max_length=128)
    principal_id = models.CharField(max_length=128)
    runs = models.PositiveIntegerField(default=0)
    calls = models.PositiveIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    cost_usd = models.FloatField(default=0.0)
    # Calls sent whose cost nobody knows (no price and no figure from the provider).
    unpriced_calls = models.PositiveIntegerField(default=0)
    admitted = models.PositiveIntegerField(default=0)
    # Attempts that waited in the admission queue before their decision (admitted or not).
    deferred = models.PositiveIntegerField(default=0)
    # Those attempts under each reason they were deferred for (one attempt may have several).
    deferred_by_reason = models.JSONField(default=dict)
    refused = models.PositiveIntegerField(default=0)
    refused_by_reason = models.JSONField(default=dict)
    queue_delay_ms_sum = models.FloatField(default=0.0)
    queue_delay_ms_max = models.FloatField(default=0.0)

    class Meta:
        abstract = True


class UsageHour(UsageFigures):
    """Usage during one hour; a run counts in the hour it finished."""

    workspace = models.ForeignKey(
        "admission.Workspace", on_delete=models.CASCADE, related_name="usage_hours"
    )
    hour = models.DateTimeField()

    class Meta:
        ordering = ("hour", "provider_id", "principal_id")
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "hour", "provider_id", "principal_id"],
                name="evaluator_usage_hour_unique",
            )
        ]
        indexes = [models.Index(fields=["workspace", "hour"], name="evaluator_usage_ws_hour")]

    def __str__(self) -> str:
        return f"usage {self.hour:%Y-%m-%d %H}h {self.provider_id}/{self.principal_id}"


class UsageDay(UsageFigures):
    """Usage during one UTC day (`day` is its midnight): the sum of that day's `UsageHour`
    rows, written in the same transaction, so long ranges read 24 times fewer rows."""

    workspace = models.ForeignKey(
        "admission.Workspace", on_delete=models.CASCADE, related_name="usage_days"
    )
    day = models.DateTimeField()

    class Meta:
        ordering = ("day", "provider_id", "principal_id")
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "day", "provider_id", "principal_id"],
                name="evaluator_usage_day_unique",
            )
        ]
        indexes = [models.Index(fields=["workspace", "day"], name="evaluator_usage_ws_day")]

    def __str__(self) -> str:
        return f"usage {self.day:%Y-%m-%d} {self.provider_id}/{self.principal_id}"
