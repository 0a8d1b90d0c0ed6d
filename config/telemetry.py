"""OpenTelemetry for this process, configured from settings.

The web process configures it when it loads the WSGI application; a worker process on its first
evaluation (so a forked pool child builds its own exporters). A signal is exported over OTLP when
the standard `OTEL_EXPORTER_OTLP_*` variables name an endpoint (see `config.env.otlp_protocol`);
with none set nothing is built, and evaluations run with no telemetry at all.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from opentelemetry import metrics, trace

from evaluator.engine.telemetry import EvaluatorTelemetry

__all__ = ["ProcessTelemetry", "configure", "evaluator_telemetry", "flush"]


@dataclass(frozen=True, slots=True)
class ProcessTelemetry:
    """The providers of this process; either may be a no-op one when its signal is not exported."""

    pid: int
    tracer_provider: Any
    meter_provider: Any
    evaluator: EvaluatorTelemetry


_lock = threading.Lock()
_current: ProcessTelemetry | None = None
_configured_pid: int | None = None
_globals_set = False


def _resource(role: str) -> Any:
    from opentelemetry.sdk.resources import Resource

    # Resource.create also merges OTEL_RESOURCE_ATTRIBUTES, as the specification asks.
    return Resource.create(
        {
            "service.name": settings.SLUICE_OTEL_SERVICE_NAME,
            "service.instance.id": f"{socket.gethostname()}-{os.getpid()}",
            "sluice.process": role,
        }
    )


def _span_exporter(protocol: str) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    return OTLPSpanExporter()


def _metric_exporter(protocol: str) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
    return OTLPMetricExporter()


def _build(role: str) -> ProcessTelemetry | None:
    traces = settings.SLUICE_OTLP_TRACES_PROTOCOL
    metrics_protocol = settings.SLUICE_OTLP_METRICS_PROTOCOL
    if traces is None and metrics_protocol is None:
        return None
    resource = _resource(role)
    tracer_provider: Any = trace.NoOpTracerProvider()
    meter_provider: Any = metrics.NoOpMeterProvider()
    if traces is not None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(traces)))
    if metrics_protocol is not None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(_metric_exporter(metrics_protocol))
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
    evaluator = EvaluatorTelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    return ProcessTelemetry(os.getpid(), tracer_provider, meter_provider, evaluator)


def configure(role: str) -> ProcessTelemetry | None:
    """Build this process's providers from settings, once per process; None when nothing is
    exported. `role` ("web", "worker") is recorded on the resource."""
    global _current, _configured_pid, _globals_set
    with _lock:
        if _configured_pid == os.getpid():
            return _current
        _current = _build(role)
        _configured_pid = os.getpid()
        if _current is not None:
            _on_worker_shutdown()
            if not _globals_set:
                # The API allows one global provider per process lineage; later ones are passed
                # explicitly to EvaluatorTelemetry, which is all the project records.
                trace.set_tracer_provider(_current.tracer_provider)
                metrics.set_meter_provider(_current.meter_provider)
                _globals_set = True
        return _current


def evaluator_telemetry() -> EvaluatorTelemetry | None:
    """What evaluations in this process record into; None when telemetry is off."""
    configured = _current if _configured_pid == os.getpid() else configure("worker")
    return configured.evaluator if configured is not None else None


def flush(**_: Any) -> None:
    """Export what is buffered now (a worker child stopping); the SDK shuts down at exit."""
    current = _current
    if current is None or current.pid != os.getpid():
        return
    for provider in (current.tracer_provider, current.meter_provider):
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is not None:
            force_flush()


def _on_worker_shutdown() -> None:
    # A pool child may leave without running atexit handlers; flush when Celery says it stops
    # (the worker process itself, with the default thread pool, or a prefork child).
    from celery.signals import worker_process_shutdown, worker_shutdown

    worker_process_shutdown.connect(flush, weak=False, dispatch_uid="sluice-telemetry")
    worker_shutdown.connect(flush, weak=False, dispatch_uid="sluice-telemetry-worker")
