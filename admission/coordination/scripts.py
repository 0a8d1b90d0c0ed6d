"""The Redis function library of the shared admission state.

`lua/lib.lua` holds what every entry shares; every other file in `lua/` is the body of one
function. They are loaded once (FUNCTION LOAD) as one library whose name carries a digest of
its text, so two releases of Sluice can share a Redis while both run, and a Redis that lost its
functions (a restart) gets them again on the first call that misses them.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).resolve().parent / "lua"

ENTRIES = (
    "acquire",
    "heartbeat",
    "install",
    "pause",
    "pump",
    "reassert",
    "release",
    "state",
    "take",
    "withdraw",
)


@cache
def _assembled() -> tuple[str, str]:
    library = (LUA_DIR / "lib.lua").read_text(encoding="utf-8")
    bodies = {name: (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8") for name in ENTRIES}
    digest = hashlib.sha256(
        (library + "".join(bodies[name] for name in ENTRIES)).encode("utf-8")
    ).hexdigest()[:12]
    parts = [f"#!lua name=sluice_{digest}", library]
    for name in ENTRIES:
        parts.append(
            f"redis.register_function('sluice_{digest}_{name}', function(_keys, args)\n"
            f"begin(args)\n{bodies[name]}\nend)"
        )
    return digest, "\n".join(parts)


def library_code() -> str:
    """The whole library, ready for FUNCTION LOAD."""
    return _assembled()[1]


def function_name(entry: str) -> str:
    """The name of an entry's function in this release's library."""
    if entry not in ENTRIES:
        raise KeyError(entry)
    return f"sluice_{_assembled()[0]}_{entry}"


def is_missing_function(error: Exception) -> bool:
    """Whether a Redis error says the library is not loaded there (yet, or any more)."""
    return "function not found" in str(error).lower()
