"""The wire between a process and the Redis functions: typed arguments in, typed results out.

Each function call is one dataclass (`Acquire`, `Release`, ...) that knows its entry's name,
packs its own arguments and parses the function's answer into a result dataclass. The functions'
own short JSON keys and their positional arguments (with `''` for "none") stay inside this
module; nothing else reads or writes them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from admission.core.evidence import BreakerTransition

__all__ = [
    "ADMIT",
    "GONE",
    "GRANT",
    "LOST",
    "NO_FIGURES",
    "NO_PROFILE",
    "QUEUED",
    "RECOVERING",
    "REFUSAL",
    "REJECT",
    "STALE",
    "TAKEN",
    "Acquire",
    "Call",
    "CoordinationUnavailable",
    "Decision",
    "Figures",
    "Header",
    "Heartbeat",
    "HeartbeatResult",
    "Install",
    "InstallResult",
    "LeaseRecord",
    "Message",
    "Pause",
    "Pump",
    "PumpResult",
    "Reassert",
    "ReassertResult",
    "Release",
    "ReleaseBatch",
    "State",
    "Take",
    "Withdraw",
    "Written",
    "parse_scope",
]

R = TypeVar("R")

# Statuses of a decision (`Decision.status`).
ADMIT, REJECT, QUEUED = "admit", "reject", "queued"
RECOVERING, NO_PROFILE, STALE = "recovering", "noprofile", "stale"
# Statuses of a write (`Written.status`): a grant taken by its process, or nothing to act on.
TAKEN, GONE = "taken", "gone"
# Kinds of a message for a waiter (`Message.kind`).
GRANT, REFUSAL, LOST = "grant", "refusal", "lost"
_KINDS = {"g": GRANT, "r": REFUSAL, "lost": LOST}


class CoordinationUnavailable(Exception):
    """Redis did not answer in time or at all; nothing was decided."""


def _optional(value: float | int | None) -> str | int:
    if value is None:
        return ""
    if type(value) is int:
        return value
    return repr(float(value))


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Header:
    """What every call carries before its own arguments."""

    SIZE: ClassVar[int] = 3
    prefix: str
    workspace_id: str
    idle_ttl_ms: int
    process_id: str
    lease_ttl_ms: int
    # The epoch of the shared state the caller knows ('' when it speaks for none).
    epoch: str
    recovery_grace_ms: int
    budget_ttl_ms: int

    def pack(self) -> list[bytes]:
        """The header as the client sends it, encoded once (a caller keeps it per workspace
        and epoch and sends the same list with every call): the process's settings as one
        JSON array (the functions decode each distinct text once), the workspace, the epoch."""
        process = [
            self.prefix,
            int(self.idle_ttl_ms),
            self.process_id,
            int(self.lease_ttl_ms),
            int(self.recovery_grace_ms),
            int(self.budget_ttl_ms),
        ]
        return [_compact(process).encode(), self.workspace_id.encode(), self.epoch.encode()]


# The fields of one scope's state, in the order the functions store them (lib.lua, FIELDS).
_SCOPE_FIELDS = (
    "a", "q", "rl", "rt", "tl", "tt", "ht", "pz", "bs", "bf", "bg", "bo", "bp", "pl", "tb", "ox",
    "h",
)  # fmt: skip


def parse_scope(raw: str | bytes | None) -> dict[str, str]:
    """One scope's stored state (a field of `<prefix>:{<workspace>}:s`) as field -> value, only
    the fields away from their defaults (operators' tools and tests read it)."""
    if raw is None:
        return {}
    text = raw.decode() if isinstance(raw, bytes) else raw
    pieces = text.split(",", len(_SCOPE_FIELDS) - 1)
    return {name: piece for name, piece in zip(_SCOPE_FIELDS, pieces, strict=False) if piece}


# ------------------------------------------------------------------------------ results


def _transitions(raw: dict[str, Any]) -> list[BreakerTransition]:
    return [
        BreakerTransition(
            provider_id=str(item["providerId"]),
            from_state=str(item["from"]),
            to_state=str(item["to"]),
            at_epoch_ms=float(item["atEpochMs"]),
            failures=int(item["failures"]),
        )
        for item in raw.get("tr") or ()
    ]


# The keys of an answer that `Figures` reads.
_FIGURE_KEYS = frozenset(("a", "q", "rp", "bs", "pz", "op", "tr"))


@dataclass(frozen=True, slots=True)
class Figures:
    """The deployment-wide figures a decision brings back for its principal and provider."""

    # False when the answer carried no figures (then active and queued are zeros).
    known: bool = False
    active: int = 0
    queued: int = 0
    retry_pressure: int = 0
    breaker_state: str = "closed"
    # Milliseconds from now until the provider's Retry-After pause ends / its breaker reopens.
    pause_ms: float = 0.0
    open_ms: float = 0.0
    transitions: list[BreakerTransition] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Figures:
        if len(raw) <= 2 and _FIGURE_KEYS.isdisjoint(raw):
            # An answer with its status (and epoch) only: most releases' and withdraws'.
            return NO_FIGURES
        get = raw.get
        active = get("a")
        return cls(
            active is not None,
            0 if active is None else int(active),
            int(get("q", 0)),
            int(get("rp", 0)),
            str(get("bs", "closed")),
            float(get("pz", 0)),
            float(get("op", 0)),
            _transitions(raw) if "tr" in raw else [],
        )

    @property
    def in_the_way_ms(self) -> float:
        """How long what is known to block the provider lasts (0 when nothing does)."""
        return max(self.pause_ms, self.open_ms)


NO_FIGURES = Figures()


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to `Acquire`: admitted, refused, queued, or what must happen first."""

    status: str
    figures: Figures = NO_FIGURES
    reason: str | None = None
    # Queued: ms until a time-based wake (a bucket refills, a pause ends) if one is due.
    wake_ms: float | None = None
    # Recovering: ms until admission resumes after the shared state was lost.
    wait_ms: float = 0.0
    # Stale: the revision Redis holds and its ledger position.
    revision: str | None = None
    sequence: int | None = None
    # A decision made for the first time (the caller counts it; see Heartbeat), not a repeat.
    counted: bool = True
    # What became of the leases the call gave back first, in their order.
    released: tuple[Written, ...] = ()

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Decision:
        get = raw.get
        wake = get("wake")
        sequence = get("seq")
        reason = get("reason")
        revision = get("rev")
        released = get("rel")
        return cls(
            str(raw["st"]),
            Figures.parse(raw),
            None if reason is None else str(reason),
            None if wake is None else float(wake),
            float(get("wait", 0)),
            None if revision is None else str(revision),
            None if sequence is None else int(sequence),
            not get("nc"),
            tuple([Written.parse(entry) for entry in released]) if released else (),
        )


@dataclass(frozen=True, slots=True)
class Message:
    """A verdict for one of this process's waiters: a grant, a refusal, or "no longer known"."""

    kind: str
    waiter_id: str
    workspace_id: str = ""
    reason: str | None = None
    figures: Figures = NO_FIGURES
    # A grant: how long its process has to take it before it lapses back to the pool.
    grant_ttl_ms: float | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Message:
        reason = raw.get("reason")
        ttl = raw.get("ttl")
        return cls(
            _KINDS.get(str(raw.get("t")), LOST),
            str(raw.get("id")),
            str(raw.get("ws", "")),
            None if reason is None else str(reason),
            Figures.parse(raw),
            None if ttl is None else float(ttl),
        )

    @classmethod
    def decode(cls, text: str | bytes) -> Message:
        return cls.parse(json.loads(text))

    @classmethod
    def from_decision(cls, waiter_id: str, decision: Decision) -> Message:
        """A decision made for a waiter being queued again, as the message it stands for."""
        kind = GRANT if decision.status == ADMIT else REFUSAL
        return cls(kind, waiter_id, "", decision.reason, decision.figures)


@dataclass(frozen=True, slots=True)
class Written:
    """The answer to a write (release, withdraw, pause, forget)."""

    status: str
    figures: Figures = NO_FIGURES

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Written:
        if len(raw) == 1:
            return cls(str(raw["st"]))  # the status alone (most releases carried by an acquire)
        return cls(str(raw["st"]), Figures.parse(raw))


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    # Live processes in the deployment's registry (None: the registry was not in this call).
    live: int | None
    # Workspace -> (its epoch, whether this process had been given up for dead there: its
    # permits there went back to the pools).
    workspaces: dict[str, tuple[str, bool]]
    audit: list[Message]

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> HeartbeatResult:
        live = raw.get("live")
        spaces = raw.get("ws") or {}
        return cls(
            None if live is None else int(live),
            {ws: (str(entry["ep"]), bool(entry.get("nb"))) for ws, entry in spaces.items()},
            [Message.parse(entry) for entry in raw.get("audit") or ()],
        )


@dataclass(frozen=True, slots=True)
class InstallResult:
    status: str
    revision: str | None = None
    sequence: int | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> InstallResult:
        sequence = raw.get("seq")
        return cls(
            str(raw["st"]),
            None if raw.get("rev") is None else str(raw["rev"]),
            None if sequence is None else int(sequence),
        )


@dataclass(frozen=True, slots=True)
class PumpResult:
    wake_ms: float | None

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> PumpResult:
        wake = raw.get("wake")
        return cls(None if wake is None else float(wake))


@dataclass(frozen=True, slots=True)
class ReassertResult:
    restored: int

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> ReassertResult:
        return cls(int(raw.get("restored", 0)))


# -------------------------------------------------------------------------------- calls


class Call(Generic[R]):
    """One function call: its entry's name, its packed arguments, and its answer's parser."""

    entry: ClassVar[str]
    # A call that may admit or queue under the caller's workspace registration.
    __slots__ = ()

    def pack(self) -> list[Any]:
        raise NotImplementedError

    def parse(self, raw: dict[str, Any]) -> R:
        raise NotImplementedError

    def repeated(self) -> Call[R]:
        """The call to send again when an earlier copy may have run (a lost answer)."""
        return self


def _pack_forgets(packed: list[Any], forgets: tuple[str, ...]) -> None:
    """Appends the invocations a call forgets (their number, then their budget ids), only when
    there are some: a call that forgets nothing sends nothing for them."""
    if forgets:
        packed.append(len(forgets))
        packed.extend(forgets)


@dataclass(frozen=True, slots=True)
class Acquire(Call[Decision]):
    """Admit now, queue fairly, or refuse one request; leases this process gave back meanwhile
    go back first, in the same call."""

    entry: ClassVar[str] = "acquire"
    revision: str
    request_id: str
    principal_id: str
    provider_id: str
    budget_id: str
    tokens: int | None
    cost_usd: float | None
    attempts: int
    dwell_ms: float | None
    # Milliseconds from now until the request's deadline, if it has one.
    deadline_in_ms: float | None
    # The caller's process has this workspace registered already (saves a write).
    registered: bool
    # The first time this request id is sent: no earlier copy can hold a permit or a place, so
    # Redis need not look (a repeat after a lost answer or a requeue sends False).
    fresh: bool = False
    releases: tuple[Release, ...] = ()
    # Invocations the caller is done with (budget ids): forgotten after the leases go back and
    # before the decision (see `ReleaseBatch`).
    forgets: tuple[str, ...] = ()

    def pack(self) -> list[Any]:
        packed = [
            self.revision,
            self.request_id,
            self.principal_id,
            self.provider_id,
            self.budget_id,
            _optional(self.tokens),
            _optional(self.cost_usd),
            self.attempts,
            _optional(self.dwell_ms),
            _optional(self.deadline_in_ms),
            "1" if self.registered else "",
            "1" if self.fresh else "",
            len(self.releases),
        ]
        for release in self.releases:
            packed.extend(release.pack())
        _pack_forgets(packed, self.forgets)
        return packed

    def parse(self, raw: dict[str, Any]) -> Decision:
        return Decision.parse(raw)

    def repeated(self) -> Acquire:
        return dataclasses.replace(self, fresh=False)


@dataclass(frozen=True, slots=True)
class Release:
    """One lease given back, with what the host reported about the call it covered; it travels
    in a `ReleaseBatch` or ahead of an `Acquire`."""

    lease_id: str
    success: bool | None = None
    retry_after_ms: float | None = None
    actual_tokens: int | None = None
    actual_cost_usd: float | None = None
    # The lease's principal and provider as the caller knows them ('' if it does not): a hint
    # of which scopes to read along with the lease; what the stored lease says decides.
    principal_id: str = ""
    provider_id: str = ""

    def pack(self) -> list[Any]:
        """Four arguments: the lease id, its principal and provider, and its outcome as one
        text (lib.lua, `outcome`): '1', '0' or '-' (no outcome), then, only when one of them is
        known, ',' retry-after ms ',' actual tokens ',' actual cost (each empty when absent)."""
        success = self.success
        said = "-" if success is None else ("1" if success else "0")
        retry_after, tokens, cost = self.retry_after_ms, self.actual_tokens, self.actual_cost_usd
        if retry_after is not None or tokens is not None or cost is not None:
            said += ",{},{},{}".format(
                "" if retry_after is None else repr(float(retry_after)),
                "" if tokens is None else int(tokens),
                "" if cost is None else repr(float(cost)),
            )
        return [self.lease_id, self.principal_id, self.provider_id, said]


@dataclass(frozen=True, slots=True)
class ReleaseBatch(Call[tuple[Written, ...]]):
    """Give leases back in one call, one answer per lease in their order; then forget the
    invocations the caller is done with (their budgets and first-admission marks: what
    `release_budget` asks for). Both are safe to repeat."""

    entry: ClassVar[str] = "release"
    releases: tuple[Release, ...]
    forgets: tuple[str, ...] = ()

    def pack(self) -> list[Any]:
        packed: list[Any] = [len(self.releases)]
        for release in self.releases:
            packed.extend(release.pack())
        _pack_forgets(packed, self.forgets)
        return packed

    def parse(self, raw: dict[str, Any]) -> tuple[Written, ...]:
        return tuple(Written.parse(entry) for entry in raw.get("rel") or ())


@dataclass(frozen=True, slots=True)
class Withdraw(Call[Written]):
    """A waiter leaves its lane; a grant made for it meanwhile goes back unused."""

    entry: ClassVar[str] = "withdraw"
    waiter_id: str
    reason: str

    def pack(self) -> list[Any]:
        return [self.waiter_id, self.reason]

    def parse(self, raw: dict[str, Any]) -> Written:
        return Written.parse(raw)


@dataclass(frozen=True, slots=True)
class Take(Call[Written]):
    """Take a grant made for one of this process's waiters (`taken`), or learn it lapsed
    (`gone`); a grant is used only once taken."""

    entry: ClassVar[str] = "take"
    waiter_id: str

    def pack(self) -> list[Any]:
        return [self.waiter_id]

    def parse(self, raw: dict[str, Any]) -> Written:
        return Written.parse(raw)


@dataclass(frozen=True, slots=True)
class Pause(Call[Written]):
    """A provider-wide Retry-After pause (starts or extends, never shortens)."""

    entry: ClassVar[str] = "pause"
    provider_id: str
    ms: float

    def pack(self) -> list[Any]:
        return [self.provider_id, repr(float(self.ms))]

    def parse(self, raw: dict[str, Any]) -> Written:
        return Written.parse(raw)


@dataclass(frozen=True, slots=True)
class Pump(Call[PumpResult]):
    """Serve a workspace's lanes now (a time-based wake fell due)."""

    entry: ClassVar[str] = "pump"

    def pack(self) -> list[Any]:
        return []

    def parse(self, raw: dict[str, Any]) -> PumpResult:
        return PumpResult.parse(raw)


@dataclass(frozen=True, slots=True)
class Install(Call[InstallResult]):
    """Make a profile revision current, unless a later one is there already."""

    entry: ClassVar[str] = "install"
    revision: str
    sequence: int
    digest: str
    # Profile hash field -> its value, as `limits.profile_fields` writes them.
    fields: dict[str, str]

    def pack(self) -> list[Any]:
        return [self.revision, self.sequence, self.digest, _compact(self.fields)]

    def parse(self, raw: dict[str, Any]) -> InstallResult:
        return InstallResult.parse(raw)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A permit this process holds, as it puts it back after the shared state was lost."""

    lease_id: str
    principal_id: str
    provider_id: str
    budget_id: str
    tokens: int | None = None
    cost_usd: float | None = None

    def encode(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "id": self.lease_id,
            "pid": self.principal_id,
            "prov": self.provider_id,
            "bud": self.budget_id,
        }
        if self.tokens is not None:
            record["tok"] = self.tokens
        if self.cost_usd is not None:
            record["cost"] = self.cost_usd
        return record


@dataclass(frozen=True, slots=True)
class Reassert(Call[ReassertResult]):
    """Put back the permits this process still holds in one workspace."""

    entry: ClassVar[str] = "reassert"
    leases: tuple[LeaseRecord, ...]

    def pack(self) -> list[Any]:
        return [_compact([lease.encode() for lease in self.leases])]

    def parse(self, raw: dict[str, Any]) -> ReassertResult:
        return ReassertResult.parse(raw)


@dataclass(slots=True)
class Heartbeat(Call[HeartbeatResult]):
    """Renew this process's lease in the workspaces it acts in, report local decision counts,
    audit long waiters. Every workspace named lies in the hash slot of `key` (on a cluster, one
    call per slot)."""

    entry: ClassVar[str] = "heartbeat"
    # workspace -> the epoch of its state this process knows ('' if none).
    epochs: dict[str, str]
    # workspace -> {(provider, decision, reason): count} of decisions made without a round trip.
    counts: dict[str, dict[tuple[str, str, str], int]]
    # workspace -> ids of this process's waiters that have waited a while.
    audit: dict[str, list[str]]
    # Renew the lease in the deployment's registry too (and count live processes).
    registry: bool = True
    # A key of the hash slot the call acts in (routing).
    key: str = ""

    def pack(self) -> list[Any]:
        counts = {
            workspace: {"\t".join(label): n for label, n in by_label.items()}
            for workspace, by_label in self.counts.items()
        }
        return [
            _compact(self.epochs),
            _compact(counts),
            _compact(self.audit),
            "1" if self.registry else "",
        ]

    def parse(self, raw: dict[str, Any]) -> HeartbeatResult:
        return HeartbeatResult.parse(raw)


@dataclass(frozen=True, slots=True)
class State(Call[dict[str, Any]]):
    """What Redis holds for one workspace (operators' views): a report document, not a
    decision, so it stays a dict whose keys `RedisCoordinator.state_sync` documents."""

    entry: ClassVar[str] = "state"
    principal_id: str = ""
    minutes: int = 0

    def pack(self) -> list[Any]:
        return [self.principal_id, self.minutes]

    def parse(self, raw: dict[str, Any]) -> dict[str, Any]:
        return raw
