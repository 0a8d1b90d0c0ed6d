"""How both controllers refuse: one evidence-carrying rejection and one retry hint."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from admission.core.errors import AdmissionRejected

if TYPE_CHECKING:
    from admission.core.evidence import AdmissionEvidence
    from admission.core.hosting import ControllerHost
    from admission.core.ticket import Ticket

__all__ = ["DEFAULT_RETRY_BASE_MS", "HINTED_REASONS", "MAX_RETRY_HINT_MS", "rejected", "retry_hint"]

MAX_RETRY_HINT_MS = 30_000
DEFAULT_RETRY_BASE_MS = 1_000.0
# Refusals that say "come back later" and so carry a retry hint.
HINTED_REASONS = frozenset({"queue-full", "queue-timeout"})


def retry_hint(in_the_way_ms: float, dwell_ms: float | None, rng: random.Random) -> float:
    """A jittered hint (0.5x to 1.5x of a base), so rejected callers do not return in lockstep.

    The base is what is known to be in the way (a Retry-After pause or an open breaker, in ms
    from now) when positive, else half of the smallest queue dwell bound (`None` or infinite
    when there is none), else one second.
    """
    base = in_the_way_ms
    if base <= 0:
        no_dwell = dwell_ms is None or dwell_ms == math.inf
        base = DEFAULT_RETRY_BASE_MS if no_dwell else dwell_ms / 2  # type: ignore[operator]
    hint = base * (0.5 + rng.random())
    return float(min(MAX_RETRY_HINT_MS, max(1, round(hint))))


def rejected(
    host: ControllerHost,
    ticket: Ticket,
    reason: str,
    evidence: AdmissionEvidence,
    hint: float | None,
) -> AdmissionRejected:
    """The refusal of `ticket` for `reason`, told to the decision listeners."""
    if hint is not None:
        evidence.retry_after_ms = hint
    if host.reports_decisions:
        host.report_decision("reject", reason, ticket.request, evidence)
    return AdmissionRejected(reason, evidence, hint)
