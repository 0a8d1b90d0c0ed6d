"""The registry as its hosts and controllers see it: arguments, listeners, shadows, the ledger,
`note_sequence`, and the eviction bookkeeping of `note_idle` and `adopt`.

Most eviction tests plug in a recording controller through `controller_factory`, the seam a
deployment-wide controller uses: the registry manages controllers only through
`hosting.HostedController`, so that protocol is what these tests hold it to.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Any

import pytest

from admission.core import (
    AdmissionRegistry,
    AdmissionRejected,
    Profile,
    ProfileConflictError,
    VirtualTimeLoop,
)

from .conftest import WORKSPACE, make_profile, profile_doc, request


class RecordingController:
    """A `HostedController` whose idleness the test sets and whose profile changes it records."""

    def __init__(self, host: AdmissionRegistry, profile: Profile) -> None:
        self.host = host
        self.workspace_id = profile.workspace_id
        self.evicted = False
        self.applied: list[Profile] = [profile]
        self.sequences: list[int] = []
        self.idle = True
        self.busy = False

    @property
    def applied_profile(self) -> Profile:
        return self.applied[-1]

    def apply_profile(self, profile: Profile) -> None:
        self.applied.append(profile)

    def is_idle(self, now_ms: float) -> bool:
        return self.idle

    def is_busy(self) -> bool:
        return self.busy

    def _note_sequence(self, sequence: int) -> None:
        self.sequences.append(sequence)


def _profile(workspace_id: str, version: str = "v1", **doc: Any) -> Profile:
    return Profile.from_dict(profile_doc(version, **doc), workspace_id=workspace_id)


def _recording_registry(max_idle_scopes: int) -> AdmissionRegistry:
    return AdmissionRegistry(
        max_idle_scopes=max_idle_scopes, controller_factory=RecordingController
    )


def _hosted(registry: AdmissionRegistry, *workspace_ids: str) -> list[RecordingController]:
    controllers = []
    for workspace_id in workspace_ids:
        controller = registry.register(_profile(workspace_id))
        assert isinstance(controller, RecordingController)
        controllers.append(controller)
    return controllers


# ------------------------------------------------------------------ construction


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_max_idle_scopes_must_be_a_non_negative_int(bad):
    with pytest.raises(ValueError) as raised:
        AdmissionRegistry(max_idle_scopes=bad)
    assert str(raised.value) == "max_idle_scopes must be a non-negative integer"


def test_zero_idle_scopes_is_allowed():
    assert AdmissionRegistry(max_idle_scopes=0).max_idle_scopes == 0


def test_controllers_draw_from_the_given_rng_or_a_private_one():
    given = random.Random(3)
    assert AdmissionRegistry(rng=given).rng is given
    first, second = AdmissionRegistry(), AdmissionRegistry()
    assert isinstance(first.rng, random.Random) and isinstance(second.rng, random.Random)
    assert first.rng is not second.rng


def test_by_default_1024_controllers_may_idle_before_eviction_starts():
    registry = AdmissionRegistry(controller_factory=RecordingController)
    doc = profile_doc()
    for i in range(1024):
        registry.register(Profile.from_dict(doc, workspace_id=f"ws-{i}"))
    assert registry.evicts_idle is False
    registry.register(Profile.from_dict(doc, workspace_id="ws-1024"))
    assert registry.evicts_idle is True


# ------------------------------------------------------------------ listeners


def test_a_failing_listener_is_logged_with_its_name_and_the_others_still_run(caplog):
    registry = AdmissionRegistry()
    seen: list[str] = []

    def broken_listener(record: Any) -> None:
        raise RuntimeError("listener bug")

    registry.on_profile_change(broken_listener)
    registry.on_profile_change(lambda record: seen.append(record.kind))
    with caplog.at_level(logging.ERROR, logger="admission.core.registry"):
        registry.register(make_profile())
    assert seen == ["initial"]
    [logged] = [r for r in caplog.records if r.name == "admission.core.registry"]
    assert logged.getMessage() == f"admission listener {broken_listener!r} failed"
    assert logged.exc_info is not None and logged.exc_info[0] is RuntimeError


def test_unsubscribing_another_listener_keeps_decisions_reported():
    loop = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=loop.clock, rng=random.Random(1))
    controller = registry.register(make_profile())
    assert not registry.reports_decisions  # nobody listens yet
    decisions: list[tuple[str, str]] = []
    stop_decisions = registry.on_decision(lambda e: decisions.append((e.decision, e.reason)))
    stop_profiles = registry.on_profile_change(lambda record: None)
    stop_breakers = registry.on_breaker_transition(lambda transition: None)
    stop_profiles()
    stop_breakers()
    assert registry.reports_decisions is True

    async def one_call(budget: str) -> None:
        (await controller.acquire(request(budget=budget))).release()

    try:
        loop.run_until_complete(one_call("a"))
        assert [decision for decision, _ in decisions] == ["admit"]
        stop_decisions()
        stop_decisions()  # a second call changes nothing
        assert registry.reports_decisions is False
        loop.run_until_complete(one_call("b"))
        assert len(decisions) == 1
    finally:
        loop.close()


# ------------------------------------------------------------------ ledger


def test_an_unknown_workspace_has_no_profile_no_history_and_no_controller():
    registry = AdmissionRegistry()
    registry.register(make_profile())
    assert registry.current_profile("elsewhere") is None
    assert registry.profile_history("elsewhere") == []
    assert registry.controller("elsewhere") is None


def test_a_change_record_names_the_new_revision_and_the_virtual_time():
    loop = VirtualTimeLoop(start_epoch_ms=1_000_000.0)
    registry = AdmissionRegistry(clock=loop.clock)
    try:
        registry.register(make_profile(version="v1"))
        loop.run_until_complete(asyncio.sleep(2.5))
        registry.register(make_profile(version="v2", workspace={"concurrency": 3}))
    finally:
        loop.close()
    first, second = registry.profile_history(WORKSPACE)
    assert (first.profile_version, first.at_epoch_ms) == ("v1", 1_000_000.0)
    assert (second.profile_version, second.at_epoch_ms) == ("v2", 1_002_500.0)
    assert second.previous_profile_version == "v1"


def test_a_conflict_names_the_workspace_the_revision_and_both_digests():
    registry = AdmissionRegistry()
    original = registry.register(make_profile(version="v1"))
    conflicting = make_profile(version="v1", workspace={"concurrency": 9})
    with pytest.raises(ProfileConflictError) as raised:
        registry.register(conflicting)
    error = raised.value
    known = registry.current_profile(WORKSPACE)
    assert known is not None and known.profile_digest != conflicting.profile_digest
    assert (error.workspace_id, error.profile_version) == (WORKSPACE, "v1")
    assert (error.existing_digest, error.new_digest) == (
        known.profile_digest,
        conflicting.profile_digest,
    )
    assert registry.controller(WORKSPACE) is original


def test_registering_the_current_revision_again_returns_the_live_controller():
    registry = AdmissionRegistry()
    controller = registry.register(make_profile(version="v1"))
    assert registry.register(make_profile(version="v1")) is controller
    assert [r.kind for r in registry.profile_history(WORKSPACE)] == ["initial"]


def test_registering_the_current_revision_of_an_evicted_workspace_returns_a_fresh_one():
    registry = _recording_registry(max_idle_scopes=0)
    [first] = _hosted(registry, "ws-a")
    registry.note_idle(first)
    fresh = registry.register(_profile("ws-a"))
    assert isinstance(fresh, RecordingController) and fresh is not first
    assert registry.controller("ws-a") is fresh
    assert len(registry.profile_history("ws-a")) == 1


def test_profile_history_is_a_copy():
    registry = AdmissionRegistry()
    registry.register(make_profile())
    registry.profile_history(WORKSPACE).clear()
    assert [r.kind for r in registry.profile_history(WORKSPACE)] == ["initial"]


# ------------------------------------------------------------------ shadows


def test_shadows_start_replace_and_stop_through_the_registry():
    registry = AdmissionRegistry()
    registry.register(make_profile())
    assert registry.shadow(WORKSPACE) is None
    first = registry.start_shadow(make_profile(version="v2"), session="audit-7")
    assert first.session == "audit-7"
    assert registry.shadow(WORKSPACE) is first
    assert registry.shadow("elsewhere") is None
    # Starting another shadow of the workspace stops the running one.
    second = registry.start_shadow(make_profile(version="v3"))
    assert first.stopped and first.mirror(request()) is None
    assert not second.stopped and second.session is None
    assert registry.shadow(WORKSPACE) is second
    assert registry.stop_shadow(WORKSPACE) is second
    assert second.stopped
    assert registry.shadow(WORKSPACE) is None
    assert registry.stop_shadow(WORKSPACE) is None


def test_shadows_of_different_workspaces_are_independent():
    registry = AdmissionRegistry()
    mine = registry.start_shadow(make_profile())
    theirs = registry.start_shadow(_profile("ws-2"))
    assert not mine.stopped
    assert registry.stop_shadow("ws-2") is theirs
    assert registry.shadow(WORKSPACE) is mine


# ------------------------------------------------------------------ note_sequence


def test_sequences_reach_a_controller_that_takes_them():
    registry = _recording_registry(max_idle_scopes=10)
    controller = registry.register(_profile("ws-a"), sequence=5)
    assert isinstance(controller, RecordingController)
    registry.register(_profile("ws-a"), sequence=6)  # the current revision again
    registry.note_sequence("ws-a", 7)
    registry.register(_profile("ws-a", "v2"), sequence=8)
    assert controller.sequences == [5, 6, 7, 8]


def test_a_sequence_for_an_evicted_workspace_reaches_a_fresh_controller():
    registry = _recording_registry(max_idle_scopes=0)
    [first] = _hosted(registry, "ws-a")
    registry.note_idle(first)
    assert first.evicted
    registry.note_sequence("ws-a", 3)
    fresh = registry.controller("ws-a")
    assert isinstance(fresh, RecordingController) and fresh is not first
    assert fresh.sequences == [3] and first.sequences == []


def test_a_sequence_is_a_no_op_for_unknown_workspaces_and_in_process_controllers():
    registry = AdmissionRegistry()
    registry.note_sequence("nowhere", 1)
    assert registry.controller("nowhere") is None
    controller = registry.register(make_profile(), sequence=1)
    registry.note_sequence(WORKSPACE, 2)
    assert registry.controller(WORKSPACE) is controller


# ------------------------------------------------------------------ note_idle


def test_the_least_recently_idle_controller_is_evicted_first():
    registry = _recording_registry(max_idle_scopes=2)
    a, b, c = _hosted(registry, "ws-a", "ws-b", "ws-c")
    assert registry.evicts_idle is True
    registry.note_idle(a)
    registry.note_idle(b)
    registry.note_idle(a)  # idle again: now the most recent
    assert not (a.evicted or b.evicted)
    registry.note_idle(c)
    assert b.evicted and not a.evicted and not c.evicted
    assert registry.evicts_idle is False
    # The ledger stays: the workspace gets a fresh controller under the same profile.
    fresh = registry.controller("ws-b")
    assert fresh is not b and fresh.applied_profile is b.applied_profile


def test_the_just_noted_controller_is_kept_when_an_older_one_is_idle():
    registry = _recording_registry(max_idle_scopes=1)
    a, b = _hosted(registry, "ws-a", "ws-b")
    registry.note_idle(a)
    assert not a.evicted
    registry.note_idle(b)
    assert a.evicted and not b.evicted
    assert registry.controller("ws-b") is b


def test_a_controller_neither_idle_nor_busy_stays_a_candidate_until_it_is_idle():
    registry = _recording_registry(max_idle_scopes=1)
    paused, b = _hosted(registry, "ws-paused", "ws-b")
    paused.idle = False  # say, a Retry-After pause still runs; it will not note itself again
    registry.note_idle(paused)
    registry.note_idle(b)
    assert not paused.evicted and b.evicted
    # The pause ends; the next note from anyone finds it idle.
    paused.idle = True
    [c] = _hosted(registry, "ws-c")
    registry.note_idle(c)
    assert paused.evicted and not c.evicted


def test_a_busy_controller_is_never_evicted_and_is_forgotten_until_it_notes_itself():
    registry = _recording_registry(max_idle_scopes=1)
    busy, b, c = _hosted(registry, "ws-busy", "ws-b", "ws-c")
    busy.idle, busy.busy = False, True
    registry.note_idle(busy)
    registry.note_idle(b)
    # The busy one leaves the candidates (it notes itself again once free); b is within bounds.
    assert not busy.evicted and not b.evicted
    busy.idle, busy.busy = True, False
    registry.note_idle(c)
    assert b.evicted and not busy.evicted and not c.evicted
    registry.note_idle(busy)
    assert c.evicted and not busy.evicted


# ------------------------------------------------------------------ adopt


def test_an_evicted_controller_takes_its_free_place_back_without_reapplying_its_profile():
    registry = _recording_registry(max_idle_scopes=0)
    [first] = _hosted(registry, "ws-a")
    registry.note_idle(first)
    assert first.evicted and registry.evicts_idle is False
    assert registry.adopt(first) is first
    assert not first.evicted
    assert registry.evicts_idle is True
    assert registry.controller("ws-a") is first
    assert first.applied == [registry.current_profile("ws-a")]


def test_an_evicted_controller_defers_to_the_live_one_and_catches_up_on_profiles():
    registry = _recording_registry(max_idle_scopes=0)
    [first] = _hosted(registry, "ws-a")
    registry.note_idle(first)
    v2 = _profile("ws-a", "v2")
    second = registry.register(v2)
    assert isinstance(second, RecordingController) and second is not first
    # Its place is taken: the live controller answers, and the evicted one stays evicted.
    assert registry.adopt(first) is second
    assert first.evicted
    registry.note_idle(second)
    assert second.evicted
    # Its place is free again: it comes back under the profile registered meanwhile.
    assert registry.adopt(first) is first
    assert first.applied_profile is v2 and len(first.applied) == 2
    assert registry.adopt(second) is first


def test_a_stale_controller_reference_is_adopted_back_under_the_current_profile():
    loop = VirtualTimeLoop()
    registry = AdmissionRegistry(clock=loop.clock, max_idle_scopes=0)
    old = registry.register(make_profile(version="v1"))

    async def body() -> str:
        (await old.acquire(request(budget="a"))).release()
        old.release_budget("a")
        assert old.evicted
        # v2 arrives while nobody holds a controller: it gets a fresh one, evicted in turn.
        newer = registry.register(
            make_profile(version="v2", principals={"alice": {"concurrency": 5}})
        )
        (await newer.acquire(request(budget="b"))).release()
        newer.release_budget("b")
        assert newer.evicted and newer is not old
        # The stale reference comes back, takes the free place and applies v2.
        lease = await old.acquire(request(budget="c"))
        assert not old.evicted
        assert registry.controller(WORKSPACE) is old
        assert old.profile.profile_version == "v2"
        lease.release()
        try:
            await old.acquire(request("bob", budget="d"))
        except AdmissionRejected as error:
            return error.reason
        return "bob was admitted"

    try:
        assert loop.run_until_complete(body()) == "unconfigured-principal"
    finally:
        loop.close()


def test_registering_for_an_evicted_workspace_makes_one_fresh_controller():
    registry = _recording_registry(max_idle_scopes=0)
    [first] = _hosted(registry, "ws-a")
    registry.note_idle(first)
    fresh = registry.register(_profile("ws-a", "v2"))
    assert fresh is not first and registry.controller("ws-a") is fresh
    assert fresh.applied == [registry.current_profile("ws-a")]
    assert len(first.applied) == 1
