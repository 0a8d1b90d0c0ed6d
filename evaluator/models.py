"""Database rows of the evaluator."""

from __future__ import annotations

from django.db import models

from evaluator.receipts import RECEIPT_SCHEMA


class Receipt(models.Model):
    """The durable receipt (v2) of one evaluation invocation.

    ``document`` is the receipt JSON the evaluator reads and writes; the other columns copy what
    operators filter on. Updates are compare-and-set on ``revision`` and stop once ``state``
    leaves ``running``.
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
    pending_dispatch = models.BooleanField(default=False)
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
