"""CNC-ADMIT-TELEMETRY in production: a real worker and web server configured by the standard
OTEL_EXPORTER_OTLP_* variables export decision.admit spans, breaker.transition events and the
decision.* metrics to an OTLP receiver, and no series names a principal or a workspace."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import BREAKING_ADAPTERS, request_with_unknown_provider, wait_for
from .otlp_collector import OtlpCollector, attributes, data_points

pytestmark = pytest.mark.celery


def _otel_env(collector: OtlpCollector) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "sluice-under-test",
        # Export within a fraction of a second instead of the minute-long defaults.
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


def _latest_points(collector: OtlpCollector) -> dict[str, list[dict[str, Any]]]:
    # Cumulative temporality: the last export of each worker process holds its totals.
    latest: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for resource, metric in collector.metrics():
        instance = str(attributes(resource).get("service.instance.id"))
        latest[(metric["name"], instance)] = data_points(metric)
    merged: dict[str, list[dict[str, Any]]] = {}
    for (name, _), points in latest.items():
        merged.setdefault(name, []).extend(points)
    return merged


def _total(points: list[dict[str, Any]], **labels: str) -> float:
    return sum(
        float(point.get("asDouble", point.get("asInt", 0)))
        for point in points
        if all(attributes(point).get(key) == value for key, value in labels.items())
    )


def test_worker_exports_admission_telemetry_without_identities(deployment):
    collector = OtlpCollector()
    env = {**_otel_env(collector), "SLUICE_ADAPTERS": BREAKING_ADAPTERS}
    try:
        deployment.start_web(env)
        deployment.start_worker(env)
        document = request_with_unknown_provider("inv-telemetry-7c1f")
        run = deployment.wait_run(deployment.submit(document)["id"])
        assert run["status"] in ("completed", "execution-uncertain"), run

        def transition_events() -> list[dict[str, Any]]:
            spans = [span for _, span in collector.spans() if span["name"] == "decision.admit"]
            events = [event for span in spans for event in span.get("events", [])]
            return [attributes(e) for e in events if e["name"] == "breaker.transition"]

        # In the embedded deployment admission is in-process, so the release that opened the
        # breaker knows it at once and the span carries the event; with Redis coordination the
        # process learns so after the span ended, and the metric (counted from the registry) is
        # where the transition shows.
        in_process = deployment.mode == "embedded"

        def exported() -> bool:
            # Spans and metrics leave the worker in separate batches: wait for both.
            points = _latest_points(collector)
            names = {span["name"] for _, span in collector.spans()}
            return (
                "decision.admit" in names
                and (bool(transition_events()) or not in_process)
                and _total(points.get("decision.breaker_transitions", []), to="open") >= 1
                and _total(points.get("decision.throttles", []), reason="unconfigured-provider")
                >= 1
            )

        try:
            wait_for(exported, 30, "admission telemetry at the receiver")
        except AssertionError as missing:
            seen = {
                name: [(attributes(p), p.get("asInt", p.get("count"))) for p in points]
                for name, points in _latest_points(collector).items()
            }
            raise AssertionError(f"{missing}: {seen}\n{deployment.logs()}") from None

        points = _latest_points(collector)
        assert _total(points["decision.admission"], decision="admit") >= 5
        assert _total(points["decision.admission"], decision="reject") >= 1
        assert "decision.queue_delay" in points
        transitions = transition_events()
        assert all(t["breaker.from"] != t["breaker.to"] for t in transitions)
        if in_process:
            assert {"breaker.from": "closed", "breaker.to": "open", "breaker.failures": "5"} in [
                {k: str(v) for k, v in t.items()} for t in transitions
            ]
        roles = {attributes(r).get("sluice.process") for r in collector.resources()}
        assert "worker" in roles
        assert {attributes(r).get("service.name") for r in collector.resources()} == {
            "sluice-under-test"
        }

        # Every label of every series, span, event and resource: no principal, workspace or
        # invocation appears, whole or in part.
        labels: list[tuple[str, str]] = []
        for resource in collector.resources():
            labels += [(k, str(v)) for k, v in attributes(resource).items()]
        for _, span in collector.spans():
            labels += [(k, str(v)) for k, v in attributes(span).items()]
            for event in span.get("events", []):
                labels += [(k, str(v)) for k, v in attributes(event).items()]
        for _, metric in collector.metrics():
            for point in data_points(metric):
                labels += [(k, str(v)) for k, v in attributes(point).items()]
        assert len(labels) > 50
        for key, value in labels:
            assert value != "demo", (key, value)
            for secret in ("demo-proposer", "demo-approver", "inv-telemetry-7c1f", run["id"]):
                assert secret not in value, (key, value)
    finally:
        collector.close()
