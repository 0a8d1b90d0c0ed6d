"""An adapter for OpenAI-compatible ``/v1/chat/completions`` endpoints over a pooled httpx client.

The API key is read at call time from the environment variable that the target (or the adapter)
names; it is never stored on the adapter, written to a repr or logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from admission.core import Clock, SystemClock
from evaluator.engine.adapters.base import AdapterCall, AdapterError, AdapterResponse

__all__ = ["OpenAIChatAdapter", "SharedClients", "parse_retry_after_ms"]

logger = logging.getLogger(__name__)

# A provider may ask for a pause; an hour is the most this adapter passes on.
MAX_RETRY_AFTER_MS = 3_600_000.0
CONNECT_TIMEOUT_S = 5.0
_REQUEST_PATH = "/v1/chat/completions"


def parse_retry_after_ms(
    headers: httpx.Headers | dict[str, str], *, now_epoch_ms: float
) -> float | None:
    """The pause a response asks for, in milliseconds, or ``None``.

    ``retry-after-ms`` (milliseconds) wins over ``Retry-After`` (delta seconds or an HTTP date).
    Unparseable, negative or non-finite values are ignored; the result is capped at one hour.
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        value = _finite_non_negative(raw_ms)
        if value is not None:
            return min(value, MAX_RETRY_AFTER_MS)
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _finite_non_negative(raw)
    if seconds is not None:
        return min(seconds * 1000.0, MAX_RETRY_AFTER_MS)
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    delta = when.timestamp() * 1000.0 - now_epoch_ms
    return min(max(delta, 0.0), MAX_RETRY_AFTER_MS)


def _finite_non_negative(raw: str) -> float | None:
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def _client(max_connections: int | None, keep_alive: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=keep_alive),
        timeout=httpx.Timeout(30.0, connect=CONNECT_TIMEOUT_S),
    )


class SharedClients:
    """Pooled httpx clients that outlive one run: one per (event loop, base URL).

    A worker makes fresh adapters for every run; with these, its runs share kept-alive
    connections to each provider instead of opening (and TLS-configuring) a new pool per run.
    A client belongs to the loop that first used it (its connections do), so another loop gets
    its own, and the clients of a closed loop are dropped.
    """

    def __init__(self) -> None:
        self._clients: dict[
            tuple[int, str], tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]
        ] = {}

    def client(self, base_url: str, max_connections: int) -> httpx.AsyncClient:
        """The running loop's client for `base_url` (made on first use)."""
        loop = asyncio.get_running_loop()
        for key, (owner, _) in list(self._clients.items()):
            if owner.is_closed():
                del self._clients[key]
        key = (id(loop), base_url)
        found = self._clients.get(key)
        if found is None or found[0] is not loop or found[1].is_closed:
            # No cap on connections at once: admission bounds the calls in flight, and the runs
            # sharing the client together may hold more than one run's `max_connections` (a
            # call must never queue here after its permit and slot). Idle ones kept: that many.
            found = self._clients[key] = (loop, _client(None, max_connections))
        return found[1]

    async def aclose(self) -> None:
        """Close the running loop's clients."""
        loop = asyncio.get_running_loop()
        for key, (owner, client) in list(self._clients.items()):
            if owner is loop:
                del self._clients[key]
                await client.aclose()


class OpenAIChatAdapter:
    """Calls an OpenAI-compatible chat-completion endpoint.

    ``base_url`` is the server root (``https://api.example.com``); the adapter posts to
    ``/v1/chat/completions``. ``client`` may be a shared ``httpx.AsyncClient`` (the caller closes
    it), or ``clients`` a ``SharedClients`` whose client for this base URL the adapter uses (its
    owner closes it); otherwise the adapter makes a pooled one on first use and ``aclose()``
    closes it.
    ``api_key_env`` names the environment variable that holds the key; it comes from the
    deployment's configuration only. Chat completions have no side effects, so the adapter is
    idempotent.
    """

    idempotent = True

    def __init__(
        self,
        *,
        base_url: str,
        client: httpx.AsyncClient | None = None,
        api_key_env: str | None = None,
        clock: Clock | None = None,
        max_connections: int = 64,
        clients: SharedClients | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._client = client
        self._clients = clients
        self._owns_client = client is None and clients is None
        self._api_key_env = api_key_env
        self._clock = clock or SystemClock()
        self._max_connections = max_connections

    def __repr__(self) -> str:
        return f"OpenAIChatAdapter(base_url={self._base_url!r}, api_key_env={self._api_key_env!r})"

    def _pool(self) -> httpx.AsyncClient:
        if self._client is None:
            if self._clients is not None:
                return self._clients.client(self._base_url, self._max_connections)
            self._client = _client(self._max_connections, self._max_connections)
        return self._client

    async def aclose(self) -> None:
        """Close the pooled client if this adapter made it."""
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    def _headers(self, call: AdapterCall) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json"}
        env_name = self._api_key_env
        if env_name is not None:
            key = os.environ.get(env_name)
            if not key:
                raise AdapterError.misconfigured(
                    detail=f"environment variable {env_name} is not set"
                )
            headers["authorization"] = f"Bearer {key}"
        return headers

    @staticmethod
    def request_body(call: AdapterCall) -> dict[str, Any]:
        """The chat-completions request body this adapter sends for `call`."""
        spec = call.output
        if spec.allowed_outputs is not None:
            instruction = "Answer with exactly one of: " + ", ".join(spec.allowed_outputs)
        else:
            instruction = "Answer with JSON that matches this schema: " + json.dumps(
                spec.schema, sort_keys=True
            )
        body: dict[str, Any] = {
            "model": call.target.model,
            "messages": [
                {"role": "system", "content": instruction},
                {"role": "user", "content": call.prompt},
            ],
            "temperature": 0,
        }
        if call.target.max_output_tokens:
            body["max_tokens"] = call.target.max_output_tokens
        return body

    async def invoke(self, call: AdapterCall) -> AdapterResponse:
        """Post the prompt and map the HTTP outcome to an answer or a typed ``AdapterError``."""
        headers = self._headers(call)
        timeout_s = call.target.timeout_ms / 1000.0
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        client = self._pool()
        url = self._base_url + _REQUEST_PATH
        try:
            response = await client.post(
                url, json=self.request_body(call), headers=headers, timeout=timeout
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as error:
            raise AdapterError.connect_error(detail=type(error).__name__) from None
        except (httpx.ReadTimeout, httpx.WriteTimeout) as error:
            # The request may be running at the provider; a timeout is not a provider failure.
            raise AdapterError.uncertain(
                provider_failure=None, detail=type(error).__name__
            ) from None
        except httpx.TransportError as error:
            raise AdapterError.uncertain(
                provider_failure=True, detail=type(error).__name__
            ) from None
        logger.debug("chat completion %s for decision %s", response.status_code, call.decision_id)
        return self._interpret(response)

    def _interpret(self, response: httpx.Response) -> AdapterResponse:
        status = response.status_code
        if status == 429:
            raise AdapterError.rate_limited(
                retry_after_ms=parse_retry_after_ms(
                    response.headers, now_epoch_ms=self._clock.epoch_ms()
                ),
                status_code=status,
            )
        if status == 408 or status >= 500:
            raise AdapterError.server_error(
                status_code=status,
                retry_after_ms=parse_retry_after_ms(
                    response.headers, now_epoch_ms=self._clock.epoch_ms()
                ),
            )
        if status >= 400:
            raise AdapterError.client_error(status_code=status)
        if status != 200:
            raise AdapterError.bad_response(status_code=status, detail="unexpected status")
        try:
            doc = response.json()
            content = doc["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise AdapterError.bad_response(
                status_code=status, detail="no choices[0].message.content"
            ) from None
        if not isinstance(content, str):
            raise AdapterError.bad_response(status_code=status, detail="content is not text")
        return AdapterResponse(answer=content, total_tokens=_total_tokens(doc))


def _total_tokens(doc: Any) -> int | None:
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        return None
    return total
