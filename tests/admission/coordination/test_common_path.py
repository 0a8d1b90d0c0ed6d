"""An acquire's common path (`common_acquire` in lib.lua) decides as the general path would.

The function library is loaded twice into one Redis: as Sluice ships it, and with the common
path switched off, so that every acquire goes the general way. Generated profiles (those of the
agreement test: shares, queue lengths, request buckets, token estimates, breakers, budgets,
reserved permits) and generated sequences of acquires, with leases given back ahead of them in
every way a caller gives them back (success, failure, retry-after, actual tokens, several at
once, one twice), are sent to both, each under a prefix of its own, with the same arguments. The
answers must be the same, and so must what each leaves in Redis: every scope's permits in use,
queued requests and request-bucket level, the leases and their records, the waiters, the
invocations' budgets and repeat counts.

What depends on the moment a call runs is left out: epochs' ids and times, the times stored
with buckets, pauses, breakers, retry pressure and leases, wake times. Request buckets refill at
most two requests a minute and the profiles have no token buckets (one refills within
milliseconds), so the moments between the two sides' calls cannot change a decision; the
levels themselves may differ by the little they refill meanwhile (LEVEL_DRIFT). The plain case's
token buckets are taken by the probe test below and by the checks.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.coordination import scripts
from admission.coordination.controller import profile_fields
from admission.coordination.protocol import Acquire, Header, Install, Release, parse_scope
from admission.core import Profile
from tests.admission.coordination.conftest import (
    SHARED_REDIS,
    WORKSPACE,
    _reachable,
    leases_in,
)
from tests.admission.coordination.test_agreement import PRINCIPALS, PROVIDERS, profiles

pytestmark = pytest.mark.skipif(
    not _reachable(SHARED_REDIS), reason=f"the common-path test needs Redis at {SHARED_REDIS}"
)

SWITCH = "local common = common_acquire()"


def library_copy(label: str, marker: str, replacement: str) -> tuple[str, str]:
    """The library with `marker` (once in it) replaced, under a name of its own (one per run, so
    runs that share a Redis leave each other's alone), and that name."""
    code = scripts.library_code()
    assert code.count(marker) == 1
    name = scripts.function_name("acquire").rsplit("_", 1)[0]
    copy = f"{name}_{label}{uuid.uuid4().hex[:8]}"
    return code.replace(marker, replacement).replace(name, copy), copy


def load_both(client: redis.Redis) -> str:
    """Loads the library as shipped and a copy of it whose common path is switched off (the
    general path decides everything); returns the copy's name, for its functions and to delete
    it afterwards."""
    code, general = library_copy("general", SWITCH, "local common = nil")
    client.function_load(code, replace=True)
    client.function_load(scripts.library_code(), replace=True)
    return general


class Side:
    """One library under one key prefix."""

    def __init__(self, client: redis.Redis, function: str, prefix: str) -> None:
        self.client = client
        self.function = function
        self.prefix = prefix
        self.header = Header(prefix, WORKSPACE, 3_600_000, "proc-1", 20_000, "", 0, 86_400_000)

    def call(self, function: str, args: list[Any]) -> dict[str, Any]:
        key = f"{self.prefix}:{{{WORKSPACE}}}:prof"
        raw = self.client.fcall(function, 1, key, *self.header.pack(), *args)
        return dict(json.loads(raw))

    def stored(self) -> dict[str, Any]:
        """What the side keeps, with what depends on the moment left out."""
        base = f"{self.prefix}:{{{WORKSPACE}}}:"
        out: dict[str, Any] = {}
        for name, raw in self.client.hgetall(base + "s").items():
            if name.startswith(b"L"):
                continue
            fields = parse_scope(raw)
            for moment in ("rt", "tt", "pz", "bo", "pl", "tb"):
                fields.pop(moment, None)
            levels = {level: float(fields.pop(level)) for level in ("rl", "tl") if level in fields}
            out[f"scope {name.decode()}"] = fields
            out[f"levels {name.decode()}"] = levels
        for lease_id, raw in leases_in(self.client.hgetall(base + "s")).items():
            lease = json.loads(raw)
            lease.pop("at", None)
            lease.pop("off", None)
            out[f"lease {lease_id}"] = lease
        for waiter_id, raw in self.client.hgetall(base + "W").items():
            waiter = json.loads(raw)
            for moment in ("arr", "exp"):
                waiter.pop(moment, None)
            out[f"waiter {waiter_id.decode()}"] = waiter
        for key in self.client.scan_iter(match=base + "b:*"):
            out[key.decode()[len(base) :]] = self.client.hgetall(key)
        for key in self.client.scan_iter(match=base + "r:*"):
            out[key.decode()[len(base) :]] = self.client.get(key)
        for key in self.client.scan_iter(match=base + "q:*"):
            out[key.decode()[len(base) :]] = self.client.lrange(key, 0, -1)
        return out


MOMENTS = ("ep", "wake", "wait", "op", "pz", "atEpochMs")


def comparable(value: Any) -> Any:
    """An answer without what depends on the moment (the epoch's id, wake, wait and pause
    times, the times of breaker transitions), at any depth."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in MOMENTS}
    if isinstance(value, list):
        return [comparable(item) for item in value]
    return value


# How far two sides' bucket levels may drift apart: the buckets refill by at most two requests
# a minute, so a second between the two sides' calls moves a level by 1/30 of a request.
LEVEL_DRIFT = 0.05


def assert_same_state(one: dict[str, Any], other: dict[str, Any], step: int) -> None:
    """The same stored state, bucket levels within the drift the sides' moments allow."""
    assert one.keys() == other.keys(), step
    for key, value in one.items():
        if key.startswith("levels "):
            assert value.keys() == other[key].keys(), (step, key)
            for level, amount in value.items():
                assert abs(amount - other[key][level]) <= LEVEL_DRIFT, (step, key, level)
        else:
            assert value == other[key], (step, key)


outcomes = st.tuples(
    st.sampled_from([True, False, None]),
    st.sampled_from([None, None, None, 250.0]),
    st.sampled_from([None, None, 3]),
)
steps = st.lists(
    st.tuples(
        st.sampled_from(PRINCIPALS),
        st.sampled_from(PROVIDERS),
        st.sampled_from([None, 0, 2, 5]),
        st.sampled_from(["inv-1", "inv-2", "fresh"]),
        # Leases given back first: indexes into those held, each with an outcome and with what
        # the caller says of its scopes (nothing, the truth, or another pair's).
        st.lists(
            st.tuples(st.integers(0, 7), outcomes, st.sampled_from(["none", "true", "other"])),
            max_size=3,
        ),
        st.booleans(),
        # Invocations the caller is done with, forgotten in the same call.
        st.lists(st.sampled_from(["inv-1", "inv-2"]), max_size=2),
    ),
    min_size=1,
    max_size=16,
)


@settings(max_examples=100)
@given(document=profiles(), sequence=steps)
def test_the_common_path_answers_and_writes_what_the_general_path_would(
    document: dict[str, Any], sequence: list[Any]
) -> None:
    client = redis.Redis.from_url(SHARED_REDIS)
    general = load_both(client)
    run = uuid.uuid4().hex[:8]
    sides = [
        Side(client, scripts.function_name("acquire"), f"common{run}"),
        Side(client, f"{general}_acquire", f"general{run}"),
    ]
    profile = Profile.from_dict(document, workspace_id=WORKSPACE)
    install = Install(profile.profile_version, 1, profile.profile_digest, profile_fields(profile))
    try:
        for side in sides:
            answer = side.call(scripts.function_name("install"), install.pack())
            assert answer["st"] == "installed", answer
        held: list[str] = []
        pairs: dict[str, tuple[str, str]] = {}
        for index, step in enumerate(sequence):
            principal, provider, tokens, budget, giving, registered, forgets = step
            releases = []
            for pick, (success, retry_after, actual), hint in giving:
                if held:
                    lease_id = held[pick % len(held)]
                    said = {"none": ("", ""), "true": pairs[lease_id]}.get(hint)
                    if said is None:
                        said = (PRINCIPALS[-1], PROVIDERS[-1])
                    release = Release(lease_id, success, retry_after, actual, None, *said)
                    releases.append(release)
            request_id = f"r{index}"
            call = Acquire(
                profile.profile_version,
                request_id,
                principal,
                provider,
                f"inv-{index}" if budget == "fresh" else budget,
                tokens,
                None,
                1,
                None,
                None,
                registered,
                True,
                tuple(releases),
                tuple(forgets),
            )
            answers = [side.call(side.function, call.pack()) for side in sides]
            assert comparable(answers[0]) == comparable(answers[1]), (index, answers)
            assert_same_state(sides[0].stored(), sides[1].stored(), index)
            for release in releases:
                if release.lease_id in held:
                    held.remove(release.lease_id)
            if answers[0]["st"] == "admit":
                held.append(request_id)
                pairs[request_id] = (principal, provider)
    finally:
        for side in sides:
            keys = list(client.scan_iter(match=f"{side.prefix}:*"))
            if keys:
                client.delete(*keys)
        client.function_delete(general)
        client.close()


def test_the_common_path_takes_the_plain_cases_and_leaves_the_rest() -> None:
    """Which acquires the common path decides, seen through a copy of the library whose common
    path says so in its answer (`st` "common"); the general path answers as it always does."""
    code, probe = library_copy(
        "probe",
        "if common then return common end",
        """if common then return '{"st":"common"}' end""",
    )
    client = redis.Redis.from_url(SHARED_REDIS)
    client.function_load(code, replace=True)
    side = Side(client, f"{probe}_acquire", f"probe{uuid.uuid4().hex[:8]}")
    document = {
        "profileVersion": "probe-v1",
        "workspace": {"concurrency": 10, "requestsPerMinute": 600},
        "providers": {"llm": {"concurrency": 10, "tokensPerSecond": 1000}},
        "principals": {"alice": {"concurrency": 5}, "bob": {"concurrency": 5, "maxAttempts": 3}},
    }
    profile = Profile.from_dict(document, workspace_id=WORKSPACE)
    install = Install(profile.profile_version, 1, profile.profile_digest, profile_fields(profile))

    def acquire(
        request_id: str,
        *releases: Release,
        principal: str = "alice",
        budget: str = "",
        fresh: bool = True,
        forgets: tuple[str, ...] = (),
    ) -> str:
        call = Acquire(
            "probe-v1",
            request_id,
            principal,
            "llm",
            budget or request_id,
            10,
            None,
            1,
            None,
            None,
            True,
            fresh,
            releases,
            forgets,
        )
        return str(side.call(side.function, call.pack())["st"])

    try:
        assert side.call(f"{probe}_install", install.pack())["st"] == "installed"
        # Nothing stored for the workspace yet: the general path looks for a withdrawn copy.
        assert acquire("r1") == "admit"
        assert acquire("r2", Release("r1", True, None, 8, None)) == "common"
        assert acquire("r3", Release("r2", None), budget="shared") == "common"
        # The caller names the lease's scopes (read with the request's), rightly or wrongly.
        assert acquire("r3a", Release("r3", True, principal_id="alice", provider_id="llm")) == (
            "common"
        )
        assert acquire("r3b", Release("r3a", True, principal_id="bob", provider_id="llm")) == (
            "common"
        )
        # Forgotten in the same call, before it is decided: a first admission again (a mark
        # left in place would send it the general way, as a repeat).
        assert acquire("r3c", Release("r3b", True), budget="shared", forgets=("shared",)) == (
            "common"
        )
        # Sent again after a lost answer: the general path looks for what the first copy took.
        assert acquire("r3", fresh=False) == "admit"
        # A principal with an invocation budget; a lease given back twice in one call.
        assert acquire("r4", principal="bob") == "admit"
        assert acquire("r5", Release("r4", True), Release("r4", True)) == "admit"
        # A second admission of one invocation on the provider is a repeat (retry pressure):
        # the common path leaves it to the general path, which counts it once.
        assert acquire("r6", budget="shared") == "admit"
        base = f"{side.prefix}:{{{WORKSPACE}}}:"
        assert client.get(base + "r:shared") == b"3:llm"
        assert client.llen(base + "pr:llm") == 1
        # A retry-after pauses the provider: the request that reports it waits.
        assert acquire("r7", Release("r5", False, 60_000.0)) == "queued"
    finally:
        keys = list(client.scan_iter(match=f"{side.prefix}:*"))
        if keys:
            client.delete(*keys)
        client.function_delete(probe)
        client.close()


def redis_time_us(client: redis.Redis) -> int:
    seconds, micro = client.time()
    return int(seconds) * 1_000_000 + int(micro)


@pytest.mark.parametrize("path", ["common", "general"])
def test_a_decision_stores_redis_time_to_the_microsecond_and_the_budget_id_as_given(
    path: str,
) -> None:
    """The time a decision stores with a bucket and a lease is Redis's own (TIME) as a decimal
    of milliseconds with the microseconds as three digits, zeros kept; a budget id with
    characters JSON escapes is in the lease as the caller gave it. On both paths, which write
    these texts each in their own way."""
    client = redis.Redis.from_url(SHARED_REDIS)
    general = load_both(client)
    function = scripts.function_name("acquire") if path == "common" else f"{general}_acquire"
    side = Side(client, function, f"time{uuid.uuid4().hex[:8]}")
    document = {
        "profileVersion": "time-v1",
        "workspace": {"concurrency": 1000, "requestsPerMinute": 6000},
        "providers": {"llm": {"concurrency": 1000, "tokensPerSecond": 1_000_000}},
        "principals": {"alice": {"concurrency": 1000}},
    }
    profile = Profile.from_dict(document, workspace_id=WORKSPACE)
    install = Install(profile.profile_version, 1, profile.profile_digest, profile_fields(profile))
    base = f"{side.prefix}:{{{WORKSPACE}}}:"
    budgets = ['in"vo/ca\\tion', "plain-budget", "unicodé ✓", "tab\there"]
    try:
        assert side.call(scripts.function_name("install"), install.pack())["st"] == "installed"
        fractions = 0
        for index in range(40):
            request_id = f"t{index}"
            budget = budgets[index % len(budgets)]
            call = Acquire(
                "time-v1",
                request_id,
                "alice",
                "llm",
                budget,
                10,
                None,
                1,
                None,
                None,
                index > 0,
                True,
                (),
                (budget,) if index > 0 else (),
            )
            before = redis_time_us(client)
            answer = side.call(side.function, call.pack())
            after = redis_time_us(client)
            assert answer["st"] == "admit", answer
            stored = client.hget(base + "s", "W")
            raw_lease = client.hget(base + "s", f"L{request_id}")
            assert stored is not None and raw_lease is not None
            assert json.loads(raw_lease)["bud"] == budget
            at = re.search(r'"at":([^,}]*)', raw_lease.decode())
            assert at is not None
            for text in (stored.decode().split(",")[3], at.group(1)):
                whole, _, fraction = text.partition(".")
                assert whole.isdigit() and (fraction == "" or len(fraction) == 3), text
                moment = int(whole) * 1000 + int(fraction or "0")
                assert before <= moment <= after, (before, text, after)
                fractions += fraction != ""
        # Almost every moment has microseconds (one in a thousand has none).
        assert fractions > 40
    finally:
        keys = list(client.scan_iter(match=f"{side.prefix}:*"))
        if keys:
            client.delete(*keys)
        client.function_delete(general)
        client.close()
