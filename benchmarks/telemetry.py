"""Telemetry overhead on the admission path: acquire+release round trips without telemetry, with
the API's no-op providers, and with the SDK recording spans and metrics as production does.

    .venv/bin/python benchmarks/telemetry.py [--iterations N]

The SDK case uses a batch span processor with an exporter that drops what it gets and an
in-memory metric reader: what is timed is recording on the admission path, not the network.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from admission.core import AdmissionRegistry, AdmissionRequest, Estimate, Profile
from evaluator.engine.telemetry import EvaluatorTelemetry

WORKSPACE = "bench"
UNBOUNDED = {"concurrency": 1_000_000, "requestsPerMinute": 1e12, "tokensPerSecond": 1e12}


class DroppingExporter(SpanExporter):
    """Takes finished batches and forgets them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _controller(telemetry: EvaluatorTelemetry | None) -> Any:
    registry = AdmissionRegistry()
    doc = {
        "profileVersion": "bench",
        "workspace": {"concurrency": 1_000_000, "maxQueueLength": 1_000_000},
        "providers": {
            "llm": {
                **UNBOUNDED,
                "circuitBreaker": {"failureThreshold": 5, "openMs": 1000, "halfOpenMaxCalls": 1},
            }
        },
        "principals": {"hot": {**UNBOUNDED, "concurrency": 8}},
    }
    controller = registry.register(Profile.from_dict(doc, workspace_id=WORKSPACE))
    if telemetry is not None:
        telemetry.watch(registry)
    return controller


async def round_trips(telemetry: EvaluatorTelemetry | None, iterations: int) -> list[int]:
    """Time acquire+release as an attempt does it: open the span, acquire, mark the admission,
    release the lease, close the span."""
    controller = _controller(telemetry)
    estimate = Estimate(tokens=200)
    requests = [
        AdmissionRequest(f"inv-{i}", "hot", WORKSPACE, "llm", estimate) for i in range(iterations)
    ]
    samples = [0] * iterations
    clock = time.perf_counter_ns
    acquire = controller.acquire
    gc.collect()
    gc.disable()
    try:
        for i, request in enumerate(requests):
            start = clock()
            span = telemetry.start(request, "llm") if telemetry is not None else None
            lease = await acquire(request)
            if span is not None:
                span.admitted(lease.evidence)
            lease.release(success=True)
            if span is not None:
                span.released(lease.evidence)
            samples[i] = clock() - start
    finally:
        gc.enable()
    return samples


def _cases() -> dict[str, Any]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return {
        "off (no exporter configured)": lambda: None,
        "API no-op providers": lambda: EvaluatorTelemetry(
            tracer_provider=trace.NoOpTracerProvider(), meter_provider=metrics.NoOpMeterProvider()
        ),
        "SDK recording (batch spans + metrics)": lambda: EvaluatorTelemetry(
            tracer_provider=tracer_provider, meter_provider=meter_provider
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        # The batch processor's export thread shares this core, as it would in a worker.
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    print(
        f"Python {sys.version.split()[0]}, one core, {args.iterations:,} acquire+release "
        "round trips per case"
    )
    baseline = None
    for label, make in _cases().items():
        asyncio.run(round_trips(make(), 5_000))  # warm up
        samples = sorted(asyncio.run(round_trips(make(), args.iterations)))
        total_s = sum(samples) / 1e9
        p50 = samples[len(samples) // 2] / 1000.0
        p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))] / 1000.0
        mean = total_s / len(samples) * 1e6
        # The median resists a busy machine better than the mean: compare medians.
        baseline = p50 if baseline is None else baseline
        print(
            f"{label:<40} {len(samples) / total_s:>10,.0f}/s   mean {mean:6.2f} µs   "
            f"p50 {p50:6.2f} µs   p99 {p99:6.2f} µs   p50 +{p50 - baseline:5.2f} µs"
        )


if __name__ == "__main__":
    main()
