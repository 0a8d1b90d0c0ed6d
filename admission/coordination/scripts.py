"""The Lua scripts of the shared admission state, each the library followed by its entry body."""

from __future__ import annotations

from functools import cache
from pathlib import Path

LUA_DIR = Path(__file__).resolve().parent / "lua"

ENTRIES = (
    "acquire",
    "forget_budget",
    "heartbeat",
    "install",
    "pause",
    "pump",
    "reassert",
    "release",
    "state",
    "withdraw",
)


@cache
def source(name: str) -> str:
    """The whole text Redis runs for entry `name`."""
    if name not in ENTRIES:
        raise KeyError(name)
    library = (LUA_DIR / "lib.lua").read_text(encoding="utf-8")
    body = (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")
    return f"{library}\n-- entry: {name}\n{body}"
