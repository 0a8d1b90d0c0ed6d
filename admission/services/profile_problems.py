"""Every problem of a profile document at once, for the people who write them.

The core parser (`Profile.from_dict`) stops at the first problem, which is right for a library
but makes an operator fix a document one error per round trip. `profile_problems` asks the
same parser about each part on its own (the top-level keys, the profile version, the workspace
limits, each provider's and each principal's limits, each limit of them) and gathers what it
says, so the form and the API can list every problem with its field. Rules that span parts
(reservations summed over principals) are checked once the parts are sound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admission.core import InvalidProfileError, Limits, Profile

__all__ = ["InvalidProfileDocument", "profile_problems"]

_PROFILE_KEYS = ("profileVersion", "workspace", "providers", "principals")
# A concurrency that never trips a reservation check while one other limit is looked at.
_ROOMY = 1_000_000_000


class InvalidProfileDocument(InvalidProfileError):
    """A profile document with one or more problems; `problems` lists them all (the first is
    this error's own field and problem)."""

    def __init__(self, problems: list[InvalidProfileError]) -> None:
        first = problems[0]
        super().__init__(first.field, first.problem)
        self.problems = list(problems)

    def reasons(self) -> list[str]:
        return [str(problem) for problem in self.problems]


def _minimal(**parts: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "profileVersion": "v",
        "workspace": {"concurrency": 1},
        "providers": {},
        "principals": {},
    }
    doc.update(parts)
    return doc


def _ask(doc: dict[str, Any], workspace_id: str) -> InvalidProfileError | None:
    try:
        Profile.from_dict(doc, workspace_id=workspace_id)
    except InvalidProfileError as error:
        return error
    return None


def _limits_problems(doc: Any, scope: str, path: str) -> list[InvalidProfileError]:
    try:
        Limits.from_dict(doc, scope=scope, path=path)  # type: ignore[arg-type]
    except InvalidProfileError as whole:
        if not isinstance(doc, Mapping):
            return [whole]
    else:
        return []
    found = []
    for key, value in doc.items():
        alone = {key: value} if key == "concurrency" else {"concurrency": _ROOMY, key: value}
        try:
            Limits.from_dict(alone, scope=scope, path=path)  # type: ignore[arg-type]
        except InvalidProfileError as error:
            found.append(error)
    if "concurrency" not in doc:
        try:
            Limits.from_dict({}, scope=scope, path=path)  # type: ignore[arg-type]
        except InvalidProfileError as error:
            found.append(error)
    if not found:
        # Each limit is fine alone: the problem lies between them.
        try:
            Limits.from_dict(doc, scope=scope, path=path)  # type: ignore[arg-type]
        except InvalidProfileError as error:
            found.append(error)
    return found


def _principal_problems(doc: Any, workspace_id: str) -> list[InvalidProfileError]:
    if isinstance(doc, Mapping):
        found = []
        for principal_id, limits in doc.items():
            where = f"principals.{principal_id}"
            named = _ask(_minimal(principals={principal_id: {"concurrency": 1}}), workspace_id)
            if named is not None:
                found.append(named)
            found += _limits_problems(limits, "principal", where)
        return found
    if not isinstance(doc, list | tuple):
        error = _ask(_minimal(principals=doc), workspace_id)
        return [error] if error is not None else []
    found = []
    for index, entry in enumerate(doc):
        where = f"principals[{index}]"
        # The entry alone, at its own index, behind placeholders that cannot be wrong.
        fillers = [{"id": f"p{n}", "limits": {"concurrency": 1}} for n in range(index)]
        if isinstance(entry, Mapping) and isinstance(entry.get("limits"), Mapping):
            shell = dict(entry) | {"limits": {"concurrency": 1}}
            error = _ask(_minimal(principals=[*fillers, shell]), workspace_id)
            if error is not None and not error.field.startswith(f"{where}.limits"):
                found.append(error)
            found += _limits_problems(entry["limits"], "principal", f"{where}.limits")
        else:
            error = _ask(_minimal(principals=[*fillers, entry]), workspace_id)
            if error is not None:
                found.append(error)
    seen: set[Any] = set()
    for index, entry in enumerate(doc):
        principal_id = entry.get("id") if isinstance(entry, Mapping) else None
        if not isinstance(principal_id, str):
            continue
        if principal_id in seen:
            found.append(
                InvalidProfileError(
                    f"principals[{index}].id", f"duplicate principal id {principal_id!r}"
                )
            )
        seen.add(principal_id)
    return found


def profile_problems(doc: Any, *, workspace_id: str) -> list[InvalidProfileError]:
    """Every problem the core finds in `doc`, each naming its field; [] when it is valid."""
    first = _ask(doc, workspace_id)
    if first is None:
        return []
    if not isinstance(doc, Mapping):
        return [first]
    try:
        found = _part_problems(doc, workspace_id)
    except Exception:
        # Whatever a part holds, the author still gets the core's own verdict.
        return [first]
    if not found:
        # Each part is sound: what is wrong spans parts (reservations over a shared pool).
        return [first]
    unique: dict[tuple[str, str], InvalidProfileError] = {}
    for error in found:
        unique.setdefault((error.field, error.problem), error)
    return list(unique.values())


def _part_problems(doc: Mapping[Any, Any], workspace_id: str) -> list[InvalidProfileError]:
    found: list[InvalidProfileError] = []
    for key in doc:
        if key not in _PROFILE_KEYS:
            found.append(InvalidProfileError(str(key), "unknown key"))
    for key in _PROFILE_KEYS:
        if key not in doc:
            found.append(InvalidProfileError(key, "is required"))
    if "profileVersion" in doc:
        error = _ask(_minimal(profileVersion=doc["profileVersion"]), workspace_id)
        if error is not None:
            found.append(error)
    if "workspace" in doc:
        found += _limits_problems(doc["workspace"], "workspace", "workspace")
    if "providers" in doc:
        providers = doc["providers"]
        if isinstance(providers, Mapping):
            for provider_id, limits in providers.items():
                named = _ask(_minimal(providers={provider_id: {"concurrency": 1}}), workspace_id)
                if named is not None:
                    found.append(named)
                found += _limits_problems(limits, "provider", f"providers.{provider_id}")
        else:
            error = _ask(_minimal(providers=providers), workspace_id)
            if error is not None:
                found.append(error)
    if "principals" in doc:
        found += _principal_problems(doc["principals"], workspace_id)
    return found
