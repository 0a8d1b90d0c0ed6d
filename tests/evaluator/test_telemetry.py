"""CNC-ADMIT-TELEMETRY: decision.admit spans, breaker.transition events, decision.* metrics."""

from __future__ import annotations

import asyncio
import json

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from admission.core import Profile
from evaluator.engine.adapters import FakeAdapter, FakeStep
from evaluator.engine.scheduler import evaluate_decision_ruleset
from evaluator.engine.telemetry import EvaluatorTelemetry
from tests.evaluator.builders import decision_doc, profile_doc, registry_with, request, run_virtual

WORKSPACE_ID = "ws-secret-tenant-5a9e"
NOISY = "principal-secret-noisy-11"
QUIET = "principal-secret-quiet-22"


def scenario(telemetry):
    async def main(loop):
        doc = profile_doc(
            workspace={"concurrency": 4},
            providers={
                "fake": {
                    "concurrency": 1,
                    "circuitBreaker": {"failureThreshold": 1, "openMs": 100, "halfOpenMaxCalls": 1},
                }
            },
            principals={NOISY: {"concurrency": 4}, QUIET: {"concurrency": 4}},
        )
        registry = registry_with(loop, Profile.from_dict(doc, workspace_id=WORKSPACE_ID))
        fake = FakeAdapter(
            {"n0": [FakeStep(latency_ms=10, error="server-error")]},
            default=FakeStep(latency_ms=10, tokens=42),
        )
        noisy = {
            "id": "noisy",
            "decisions": [
                decision_doc("n0", retry={"maxAttempts": 2, "initialBackoffMs": 50}),
                decision_doc("n1", adapter="ghost"),
            ],
        }
        quiet = {"id": "quiet", "decisions": [decision_doc("q0")]}
        adapters = {"fake": fake, "ghost": fake}
        runs = [
            evaluate_decision_ruleset(
                request(noisy, principal_id=NOISY, workspace_id=WORKSPACE_ID),
                registry=registry,
                adapters=adapters,
                telemetry=telemetry,
            ),
            evaluate_decision_ruleset(
                request(quiet, principal_id=QUIET, workspace_id=WORKSPACE_ID),
                registry=registry,
                adapters=adapters,
                telemetry=telemetry,
            ),
        ]
        return await asyncio.gather(*runs)

    return run_virtual(main)


def test_CNC_ADMIT_TELEMETRY_001_spans_events_and_metrics_carry_no_identities():
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = EvaluatorTelemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)

    noisy, quiet = scenario(telemetry)

    spans = exporter.get_finished_spans()
    assert spans and all(span.name == "decision.admit" for span in spans)
    by_decision: dict[str, list] = {"admit": [], "reject": [], "defer": []}
    for span in spans:
        by_decision[span.attributes["admission.decision"]].append(span)
    attempts = [a for r in (noisy, quiet) for d in r.decisions for a in d.attempts]
    # One span per admission decision: every sent attempt was admitted, every other refused.
    assert len(by_decision["admit"]) == sum(1 for a in attempts if a.sent) == 3
    assert len(by_decision["reject"]) == sum(1 for a in attempts if not a.sent) == 1
    assert {s.attributes["admission.reason"] for s in by_decision["defer"]} >= {
        "concurrency",
        "circuit-open",
    }
    assert all(s.status.status_code == StatusCode.OK for s in by_decision["admit"])
    assert all(s.status.status_code == StatusCode.UNSET for s in by_decision["defer"])
    assert all(s.status.status_code == StatusCode.ERROR for s in by_decision["reject"])
    (rejected,) = by_decision["reject"]
    assert rejected.attributes["admission.reason"] == "unconfigured-provider"
    admitted = by_decision["admit"][0]
    for key in (
        "admission.queue_delay_ms",
        "admission.active",
        "admission.queued",
        "admission.estimated_tokens",
        "admission.retry_pressure",
        "admission.breaker_state",
        "adapter.id",
    ):
        assert key in admitted.attributes, key
    transitions = [
        (event.attributes["breaker.from"], event.attributes["breaker.to"])
        for span in spans
        for event in span.events
        if event.name == "breaker.transition"
    ]
    assert transitions == [("closed", "open"), ("open", "half-open"), ("half-open", "closed")]

    metrics = json.loads(reader.get_metrics_data().to_json())
    points: dict[str, list] = {}
    for resource in metrics["resource_metrics"]:
        for scope in resource["scope_metrics"]:
            for metric in scope["metrics"]:
                points[metric["name"]] = metric["data"]["data_points"]
    assert set(points) >= {
        "decision.admission",
        "decision.throttles",
        "decision.breaker_transitions",
        "decision.queue_delay",
    }
    for name in ("decision.admission", "decision.throttles", "decision.breaker_transitions"):
        for point in points[name]:
            assert set(point["attributes"]) <= {"decision", "reason", "breaker_state", "from", "to"}
    assert sum(p["value"] for p in points["decision.breaker_transitions"]) == 3

    # Nothing anywhere in telemetry names a principal or a workspace.
    exported = json.dumps(
        [json.loads(span.to_json()) for span in spans] + [metrics], sort_keys=True
    )
    for secret in (WORKSPACE_ID, NOISY, QUIET, "secret"):
        assert secret not in exported


def test_admission_spans_stay_open_until_the_lease_is_released():
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = EvaluatorTelemetry(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[])
    )
    finished_during_call = []

    def respond(call):
        finished_during_call.append(len(exporter.get_finished_spans()))
        return FakeStep(latency_ms=25)

    async def main(loop):
        registry = registry_with(loop, Profile.from_dict(profile_doc(), workspace_id=WORKSPACE_ID))
        req = request({"id": "one", "decisions": [decision_doc("d0")]}, workspace_id=WORKSPACE_ID)
        return await evaluate_decision_ruleset(
            req,
            registry=registry,
            adapters={"fake": FakeAdapter(responder=respond)},
            telemetry=telemetry,
        )

    run_virtual(main)
    assert finished_during_call == [0]
    (span,) = exporter.get_finished_spans()
    assert span.attributes["admission.decision"] == "admit"
