"""What a host asks admission for: an estimate of the work and the trusted scope it runs in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from admission.core.signal import CancelSignal


class Estimate:
    """The host's estimate of one dispatch; `None` means unknown.

    It is not validated on construction: host estimates are untrusted and `acquire` judges them.
    Its parameters are its seven optional fields, one each.
    """

    __slots__ = (
        "attempts",
        "batch_size",
        "cost_usd",
        "items",
        "request_bytes",
        "retained_work",
        "tokens",
    )

    def __init__(
        self,
        tokens: Any = None,
        cost_usd: Any = None,
        request_bytes: Any = None,
        items: Any = None,
        attempts: Any = None,
        batch_size: Any = None,
        retained_work: Any = None,
    ) -> None:
        self.tokens = tokens
        self.cost_usd = cost_usd
        self.request_bytes = request_bytes
        self.items = items
        self.attempts = attempts
        self.batch_size = batch_size
        self.retained_work = retained_work

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Estimate({fields})"


class AdmissionRequest:
    """One attempt that wants to dispatch: budget, trusted principal/workspace, provider lane.

    `deadline_ms` is on the clock's monotonic millisecond scale; `signal` is a `CancelSignal`.
    Its parameters are its fields, one each: the four that identify the attempt, then three
    optional ones.
    """

    __slots__ = (
        "budget_id",
        "deadline_ms",
        "estimate",
        "principal_id",
        "provider_id",
        "signal",
        "workspace_id",
    )

    def __init__(
        self,
        budget_id: str,
        principal_id: str,
        workspace_id: str,
        provider_id: str,
        estimate: Estimate | None = None,
        deadline_ms: float | None = None,
        signal: CancelSignal | None = None,
    ) -> None:
        self.budget_id = budget_id
        self.principal_id = principal_id
        self.workspace_id = workspace_id
        self.provider_id = provider_id
        self.estimate = estimate if estimate is not None else Estimate()
        self.deadline_ms = deadline_ms
        self.signal = signal

    def __repr__(self) -> str:
        # Principal and workspace ids are trusted identities: keep them out of logged reprs.
        return (
            f"AdmissionRequest(budget_id={self.budget_id!r}, provider_id={self.provider_id!r}, "
            f"deadline_ms={self.deadline_ms!r})"
        )
