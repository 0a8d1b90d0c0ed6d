"""OpenTelemetry for admission decisions: ``decision.admit`` spans, ``breaker.transition`` events
and the ``decision.*`` metrics.

Only fixed vocabularies and aggregate figures leave this module: decisions, reasons, breaker
states, counts, estimates, delays and the adapter id. Principal and workspace ids never do.
"""

from __future__ import annotations

import weakref
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import Status, StatusCode

from admission.core import REASONS, AdmissionRegistry, AdmissionRejected, AdmissionRequest

__all__ = ["AdmissionSpan", "EvaluatorTelemetry"]

INSTRUMENTATION = "sluice.evaluator"
_DECISIONS = frozenset({"admit", "reject", "defer"})
_BREAKER_STATES = frozenset({"closed", "open", "half-open"})


def _word(value: Any, vocabulary: frozenset[str]) -> str:
    # Anything outside the vocabulary is folded, so no free text can reach a label.
    return value if value in vocabulary else "other"


class EvaluatorTelemetry:
    """Spans and metrics for the evaluator's admission decisions.

    Pass a ``tracer_provider`` and ``meter_provider`` (for example the SDK's, with in-memory
    exporters in tests); the global providers are used otherwise. ``watch(registry)`` subscribes
    to the registry's decision events so that deferrals, which happen inside the controller,
    close their span too.
    """

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        tracer_provider = tracer_provider or trace.get_tracer_provider()
        meter_provider = meter_provider or metrics.get_meter_provider()
        self._tracer = tracer_provider.get_tracer(INSTRUMENTATION)
        meter = meter_provider.get_meter(INSTRUMENTATION)
        self._admissions = meter.create_counter(
            "decision.admission", unit="{decision}", description="Admission decisions"
        )
        self._throttles = meter.create_counter(
            "decision.throttles", unit="{decision}", description="Deferred or rejected attempts"
        )
        self._transitions = meter.create_counter(
            "decision.breaker_transitions", unit="{transition}", description="Breaker transitions"
        )
        self._queue_delay = meter.create_histogram(
            "decision.queue_delay", unit="ms", description="Time from admission request to decision"
        )
        self._open: dict[int, AdmissionSpan] = {}
        self._watched: weakref.WeakKeyDictionary[AdmissionRegistry, Any] = (
            weakref.WeakKeyDictionary()
        )

    def watch(self, registry: AdmissionRegistry) -> None:
        """Follow ``registry``'s decision events (deferrals) and breaker transitions; idempotent.

        Transitions are counted from the registry, not from lease evidence: a coordinated
        controller learns of the transition a release caused only after the release returned.
        """
        if registry not in self._watched:
            self._watched[registry] = (
                registry.on_decision(self._on_decision),
                registry.on_breaker_transition(self._on_transition),
            )

    def start(self, request: AdmissionRequest, adapter_id: str) -> AdmissionSpan:
        """Open the span of an admission request that is about to be made."""
        span = AdmissionSpan(self, request, adapter_id)
        self._open[id(request)] = span
        return span

    def _on_decision(self, event: Any) -> None:
        if event.decision != "defer":
            return
        span = self._open.get(id(event.request))
        if span is not None and span.request is event.request:
            span.deferred(event.reason)

    def _forget(self, span: AdmissionSpan) -> None:
        if self._open.get(id(span.request)) is span:
            del self._open[id(span.request)]

    def _count(self, decision: str, reason: str, breaker_state: str) -> None:
        labels = {
            "decision": _word(decision, _DECISIONS),
            "reason": _word(reason, REASONS),
            "breaker_state": _word(breaker_state, _BREAKER_STATES),
        }
        self._admissions.add(1, labels)
        if decision != "admit":
            self._throttles.add(1, {"decision": labels["decision"], "reason": labels["reason"]})

    def _on_transition(self, transition: Any) -> None:
        self._transitions.add(
            1,
            {
                "from": _word(transition.from_state, _BREAKER_STATES),
                "to": _word(transition.to_state, _BREAKER_STATES),
            },
        )


class AdmissionSpan:
    """The live ``decision.admit`` span of one admission request.

    It ends on rejection, on deferral (and a fresh span continues the wait) or, for an admitted
    request, when its lease is released.
    """

    __slots__ = ("_emitted", "_span", "_telemetry", "adapter_id", "request")

    def __init__(self, telemetry: EvaluatorTelemetry, request: AdmissionRequest, adapter_id: str):
        self._telemetry = telemetry
        self.request = request
        self.adapter_id = adapter_id
        self._emitted = 0
        self._span = self._open_span()

    def _open_span(self) -> Any:
        return self._telemetry._tracer.start_span(
            "decision.admit", attributes={"adapter.id": self.adapter_id}
        )

    def deferred(self, reason: str) -> None:
        """The controller queued the request; this span ends as a deferral, a new one waits."""
        span = self._span
        if span is None:
            return
        span.set_attribute("admission.decision", "defer")
        span.set_attribute("admission.reason", _word(reason, REASONS))
        span.end()
        self._telemetry._count("defer", reason, "other")
        self._span = self._open_span()

    def admitted(self, evidence: Any) -> None:
        """The request was admitted; the span stays open until ``released``."""
        span = self._span
        if span is None:
            return
        self._describe(span, evidence)
        span.set_status(Status(StatusCode.OK))
        self._emit_transitions(evidence)
        self._telemetry._count("admit", "admitted", evidence.breaker_state)
        self._telemetry._queue_delay.record(evidence.queue_delay_ms, {"decision": "admit"})
        self._telemetry._forget(self)

    def rejected(self, rejection: AdmissionRejected) -> None:
        """The request was refused; the span ends with an error status."""
        span = self._span
        if span is None:
            return
        evidence = rejection.evidence
        if evidence is not None:
            self._describe(span, evidence)
            self._emit_transitions(evidence)
            self._telemetry._queue_delay.record(evidence.queue_delay_ms, {"decision": "reject"})
        else:
            span.set_attribute("admission.decision", "reject")
            span.set_attribute("admission.reason", _word(rejection.reason, REASONS))
        span.set_status(Status(StatusCode.ERROR, _word(rejection.reason, REASONS)))
        state = evidence.breaker_state if evidence is not None else "other"
        self._telemetry._count("reject", rejection.reason, state)
        self._close()

    def released(self, evidence: Any) -> None:
        """The admitted attempt gave its lease back; transitions it caused, as far as the lease's
        evidence knows them yet, become events of the span."""
        if self._span is None:
            return
        self._emit_transitions(evidence)
        self._close()

    def abandoned(self) -> None:
        """Admission ended without a decision (a host error); the span ends unset."""
        if self._span is not None:
            self._close()

    def _close(self) -> None:
        self._span.end()
        self._span = None
        self._telemetry._forget(self)

    @staticmethod
    def _describe(span: Any, evidence: Any) -> None:
        span.set_attribute("admission.decision", _word(evidence.decision, _DECISIONS))
        span.set_attribute("admission.reason", _word(evidence.reason, REASONS))
        span.set_attribute("admission.queue_delay_ms", float(evidence.queue_delay_ms))
        span.set_attribute("admission.active", int(evidence.active))
        span.set_attribute("admission.queued", int(evidence.queued))
        if evidence.estimated_tokens is not None:
            span.set_attribute("admission.estimated_tokens", int(evidence.estimated_tokens))
        if evidence.estimated_cost_usd is not None:
            span.set_attribute("admission.estimated_cost_usd", float(evidence.estimated_cost_usd))
        span.set_attribute("admission.retry_pressure", int(evidence.retry_pressure))
        span.set_attribute(
            "admission.breaker_state", _word(evidence.breaker_state, _BREAKER_STATES)
        )
        if evidence.retry_after_ms is not None:
            span.set_attribute("admission.retry_after_ms", float(evidence.retry_after_ms))

    def _emit_transitions(self, evidence: Any) -> None:
        transitions = evidence.breaker_transitions or []
        for transition in transitions[self._emitted :]:
            self._span.add_event(
                "breaker.transition",
                attributes={
                    "breaker.from": _word(transition.from_state, _BREAKER_STATES),
                    "breaker.to": _word(transition.to_state, _BREAKER_STATES),
                    "breaker.failures": int(transition.failures),
                },
            )
        self._emitted = max(self._emitted, len(transitions))
