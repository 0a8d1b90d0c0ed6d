"""A real OTLP/HTTP receiver on 127.0.0.1 (port 0) that keeps every export request it gets."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

_MESSAGES = {"/v1/traces": ExportTraceServiceRequest, "/v1/metrics": ExportMetricsServiceRequest}


class OtlpCollector:
    """Decodes protobuf exports to dicts; `url` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    def __init__(self) -> None:
        self.exports: dict[str, list[dict[str, Any]]] = {path: [] for path in _MESSAGES}
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                message = _MESSAGES.get(self.path)
                if message is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                decoded = MessageToDict(message.FromString(body))
                with collector._lock:
                    collector.exports[self.path].append(decoded)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _requests(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.exports[path])

    def _items(self, path: str, kind: str, item: str) -> Iterator[tuple[dict, dict]]:
        for request in self._requests(path):
            for entry in request.get(f"resource{kind}", []):
                for scope in entry.get(f"scope{kind}", []):
                    for found in scope.get(item, []):
                        yield entry.get("resource", {}), found

    def spans(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(resource, span) for every span received."""
        return self._items("/v1/traces", "Spans", "spans")

    def metrics(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(resource, metric) for every metric received."""
        return self._items("/v1/metrics", "Metrics", "metrics")

    def resources(self) -> list[dict[str, Any]]:
        found = []
        for path, key in (("/v1/traces", "resourceSpans"), ("/v1/metrics", "resourceMetrics")):
            for request in self._requests(path):
                found += [entry.get("resource", {}) for entry in request.get(key, [])]
        return found


def attributes(item: dict[str, Any]) -> dict[str, Any]:
    """An OTLP attribute list as a plain mapping of key to its (single) value."""
    return {
        entry["key"]: next(iter(entry.get("value", {}).values()), None)
        for entry in item.get("attributes", [])
    }


def data_points(metric: dict[str, Any]) -> list[dict[str, Any]]:
    for kind in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
        if kind in metric:
            return list(metric[kind].get("dataPoints", []))
    return []
