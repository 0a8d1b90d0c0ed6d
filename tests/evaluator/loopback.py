"""A real HTTP server on 127.0.0.1 (port 0) that plays scripted chat-completion responses."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted response; ``hold`` keeps it back until the event is set."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None
    # The longest a held reply waits for its event before answering anyway.
    hold_seconds: float = 30.0
    content: str = "yes"
    total_tokens: int = 10
    # Seconds the server takes before it answers (a provider's service time).
    delay: float = 0.0

    def payload(self) -> bytes:
        if self.body is not None:
            return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()
        if self.status != 200:
            return json.dumps({"error": {"message": "scripted"}}).encode()
        return json.dumps(
            {
                "id": "cmpl-1",
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": self.content}}
                ],
                "usage": {
                    "prompt_tokens": 4,
                    "completion_tokens": 6,
                    "total_tokens": self.total_tokens,
                },
            }
        ).encode()


class LoopbackServer:
    """Counts requests, tracks in-flight requests and their high-water mark.

    A request is in flight from its arrival until the provider starts writing its reply: a
    client that gives up on it (closes the connection) does not end it sooner."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.default = Reply()
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.received = threading.Semaphore(0)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY, as providers' servers set it: the body, written after the headers,
            # does not wait for the client's delayed ACK (40 ms on a kept-alive connection).
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"null")
                entry = {
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": body,
                    "at": time.monotonic(),
                    # The client's port: calls on one kept-alive connection share it.
                    "peer": self.client_address[1],
                }
                with server._lock:
                    server.requests.append(entry)
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    reply = server.replies.popleft() if server.replies else server.default
                    entry["held"] = reply.hold is not None
                server.received.release()
                answered = False

                def answer() -> None:
                    with server._lock:
                        server.in_flight -= 1
                        entry["ended"] = time.monotonic()

                try:
                    if reply.hold is not None:
                        reply.hold.wait(reply.hold_seconds)
                    if reply.delay:
                        time.sleep(reply.delay)
                    payload = reply.payload()
                    # The call ends here, before a byte of the answer is written: the client
                    # cannot have the answer (and start its next call) before this point, so
                    # counting the call until after the write would, in a thread starved of
                    # CPU, overlap it with a next call that really came after it.
                    answered = True
                    answer()
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                finally:
                    if not answered:
                        answer()

        class Server(ThreadingHTTPServer):
            # A provider's listen backlog: socketserver's default of 5 drops connections when a
            # wave of calls connects at once, and the client retries a second later.
            request_queue_size = 128

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
