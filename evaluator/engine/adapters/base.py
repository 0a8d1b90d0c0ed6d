"""The adapter contract: what the evaluator hands an adapter and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from evaluator.engine.outputs import OutputSpec
from evaluator.engine.rulesets import Target

__all__ = [
    "ERROR_KINDS",
    "Adapter",
    "AdapterCall",
    "AdapterError",
    "AdapterResponse",
]

RATE_LIMITED = "rate-limited"
SERVER_ERROR = "server-error"
CLIENT_ERROR = "client-error"
CONNECT_ERROR = "connect-error"
BAD_RESPONSE = "bad-response"
UNCERTAIN = "uncertain"
MISCONFIGURED = "misconfigured"

ERROR_KINDS = frozenset(
    {
        RATE_LIMITED,
        SERVER_ERROR,
        CLIENT_ERROR,
        CONNECT_ERROR,
        BAD_RESPONSE,
        UNCERTAIN,
        MISCONFIGURED,
    }
)


@dataclass(frozen=True, slots=True)
class AdapterCall:
    """One dispatch: the rendered prompt for one decision on one target.

    ``signal`` is the composed cancel signal (caller, total deadline, target deadline); the
    evaluator also cancels the adapter's task when it fires, so honouring it is a courtesy.
    """

    decision_id: str
    prompt: str
    target: Target
    output: OutputSpec
    attempt: int
    signal: Any = None


@dataclass(frozen=True, slots=True)
class AdapterResponse:
    """A provider's answer; ``total_tokens`` and ``cost_usd`` are what it really used, if known."""

    answer: Any
    total_tokens: int | None = None
    cost_usd: float | None = None


class AdapterError(Exception):
    """A dispatch that produced no answer, classified for retry, fallback and breaker decisions.

    ``kind`` is one of ``ERROR_KINDS``. ``sent`` says whether the request may have reached the
    provider; ``uncertain`` errors always have ``sent`` true. ``provider_failure`` is what the
    admission breaker should learn: ``True`` a failure, ``False`` a healthy provider, ``None``
    no signal (timeouts, throttling). ``retry_after_ms`` is the provider's pause request.

    Its parameters are its fields, keyword-only past ``kind``, so every raise names each
    classification it makes.
    """

    def __init__(
        self,
        kind: str,
        *,
        sent: bool,
        retryable: bool,
        provider_failure: bool | None,
        retry_after_ms: float | None = None,
        status_code: int | None = None,
        total_tokens: int | None = None,
        detail: str = "",
    ) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"unknown adapter error kind {kind!r}")
        super().__init__(kind, detail)
        self.kind = kind
        self.sent = sent or kind == UNCERTAIN
        self.retryable = retryable
        self.provider_failure = provider_failure
        self.retry_after_ms = retry_after_ms
        self.status_code = status_code
        self.total_tokens = total_tokens
        self.detail = detail

    @property
    def reason(self) -> str:
        """A fixed-vocabulary detail for attempt records: ``http-503``, ``connect-error``..."""
        if self.status_code is not None:
            return f"http-{self.status_code}"
        return self.kind

    def __str__(self) -> str:
        text = f"{self.kind} ({self.reason})" if self.status_code is not None else self.kind
        return f"{text}: {self.detail}" if self.detail else text

    @classmethod
    def rate_limited(
        cls, *, retry_after_ms: float | None = None, status_code: int | None = 429, detail: str = ""
    ) -> AdapterError:
        """The provider throttled the call (HTTP 429); not a breaker failure."""
        return cls(
            RATE_LIMITED,
            sent=True,
            retryable=True,
            provider_failure=None,
            retry_after_ms=retry_after_ms,
            status_code=status_code,
            detail=detail,
        )

    @classmethod
    def server_error(
        cls, *, status_code: int | None = 500, retry_after_ms: float | None = None, detail: str = ""
    ) -> AdapterError:
        """The provider failed (HTTP 5xx); retryable and a breaker failure."""
        return cls(
            SERVER_ERROR,
            sent=True,
            retryable=True,
            provider_failure=True,
            retry_after_ms=retry_after_ms,
            status_code=status_code,
            detail=detail,
        )

    @classmethod
    def client_error(cls, *, status_code: int | None = 400, detail: str = "") -> AdapterError:
        """The provider refused the request as malformed or unauthorised; retrying cannot help."""
        return cls(
            CLIENT_ERROR,
            sent=True,
            retryable=False,
            provider_failure=False,
            status_code=status_code,
            detail=detail,
        )

    @classmethod
    def connect_error(cls, *, detail: str = "") -> AdapterError:
        """No connection could be made, so nothing was sent; retryable and a breaker failure."""
        return cls(CONNECT_ERROR, sent=False, retryable=True, provider_failure=True, detail=detail)

    @classmethod
    def bad_response(cls, *, status_code: int | None = None, detail: str = "") -> AdapterError:
        """The provider answered with something that is not a usable response."""
        return cls(
            BAD_RESPONSE,
            sent=True,
            retryable=True,
            provider_failure=True,
            status_code=status_code,
            detail=detail,
        )

    @classmethod
    def uncertain(cls, *, provider_failure: bool | None = None, detail: str = "") -> AdapterError:
        """The request was sent and its outcome is unknown (read timeout, dropped connection)."""
        return cls(
            UNCERTAIN, sent=True, retryable=False, provider_failure=provider_failure, detail=detail
        )

    @classmethod
    def misconfigured(cls, *, detail: str = "") -> AdapterError:
        """The adapter cannot send at all (a missing credential); nothing was sent."""
        return cls(MISCONFIGURED, sent=False, retryable=False, provider_failure=None, detail=detail)


@runtime_checkable
class Adapter(Protocol):
    """Answers one decision on one target.

    ``idempotent`` says whether an answer of unknown outcome may be asked again (a pure
    chat completion) or not (a sub-agent that acts); it governs retry after
    ``execution-uncertain``.
    """

    idempotent: bool

    async def invoke(self, call: AdapterCall) -> AdapterResponse:
        """Return the answer or raise ``AdapterError``; any other exception after dispatch is
        treated as an unknown outcome."""
        ...
