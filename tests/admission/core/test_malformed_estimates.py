"""Malformed host estimates fail closed as invalid-estimate and leave no trace."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from admission.core import AdmissionRejected

from .conftest import Scenario, examples, make_profile, request

FIELDS = ("tokens", "cost_usd", "request_bytes", "items", "attempts", "batch_size", "retained_work")

junk = st.one_of(
    st.booleans(),
    st.text(max_size=4),
    st.integers(max_value=-1),
    st.floats(allow_nan=True, allow_infinity=True).filter(
        lambda x: not math.isfinite(x) or x < 0 or not x.is_integer()
    ),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@settings(max_examples=examples(200), deadline=None)
@given(field=st.sampled_from(FIELDS), value=junk, busy=st.booleans())
def test_any_malformed_estimate_field_rejects_before_any_queue_slot(field, value, busy):
    if field == "cost_usd" and isinstance(value, float) and math.isfinite(value) and value >= 0:
        return  # a fractional cost is a valid amount of money
    scenario = Scenario(make_profile(principals={"alice": {"concurrency": 1, "maxQueueLength": 3}}))

    async def body(s):
        holder = await s.admit(request(budget="holder")) if busy else None
        try:
            lease = await s.controller.acquire(request(budget="x", **{field: value}))
        except AdmissionRejected as error:
            assert error.reason == "invalid-estimate"
            assert error.evidence.estimated_tokens is None
            assert error.evidence.estimated_cost_usd is None
        else:
            lease.release()
            raise AssertionError(f"{field}={value!r} was admitted")
        assert s.controller.snapshot("alice") == ((1, 0) if busy else (0, 0))
        assert s.controller._budget_scopes.keys() <= {"holder"}
        if holder is not None:
            holder.release()
        assert s.controller.snapshot("alice") == (0, 0)

    try:
        scenario.run(body)
    finally:
        scenario.close()
