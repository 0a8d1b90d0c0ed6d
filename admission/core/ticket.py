"""One acquire call as both controllers judge it: the request and its checked estimate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from admission.core.rules import valid_amount, valid_count

if TYPE_CHECKING:
    from admission.core.request import AdmissionRequest

__all__ = ["Ticket"]


def _as_int(value: Any) -> int | None:
    return value if value is None or type(value) is int else int(value)


class Ticket:
    """A request and its estimate, judged once: valid figures as ints and floats, or `invalid`.

    Malformed host figures never reach evidence or any counter: an invalid ticket carries no
    figures (and one attempt). A subclass may add slots for its own bookkeeping.
    """

    # Every dispatch takes one request from each request bucket (see `rules`).
    requests = 1

    __slots__ = (
        "arrived_ms",
        "attempts",
        "batch_size",
        "cost",
        "invalid",
        "items",
        "request",
        "request_bytes",
        "retained_work",
        "tokens",
    )

    def __init__(self, request: AdmissionRequest, now_ms: float) -> None:
        self.request = request
        self.arrived_ms = now_ms
        estimate = request.estimate
        tokens = estimate.tokens
        request_bytes = estimate.request_bytes
        items = estimate.items
        attempts = estimate.attempts
        batch_size = estimate.batch_size
        retained_work = estimate.retained_work
        cost = estimate.cost_usd
        invalid = False
        # Plain non-negative ints (the common case) pass without a call per field.
        for value in (tokens, request_bytes, items, attempts, batch_size, retained_work):
            plain = value is None or (type(value) is int and value >= 0)
            if not plain and not valid_count(value):
                invalid = True
                break
        if cost is not None and not valid_amount(cost):
            invalid = True
        self.invalid = invalid
        if invalid:
            self.tokens = self.request_bytes = self.items = None
            self.batch_size = self.retained_work = None
            self.attempts = 1
            self.cost = None
            return
        # Integral floats count as the integers they are.
        self.tokens = tokens if tokens is None or type(tokens) is int else int(tokens)
        self.request_bytes = _as_int(request_bytes)
        self.items = _as_int(items)
        self.batch_size = _as_int(batch_size)
        self.retained_work = _as_int(retained_work)
        self.attempts = 1 if attempts is None else int(attempts)
        self.cost = float(cost) if cost is not None else None
