"""Where a decision's Lua goes: VM instructions per acquire of the admission functions.

    python benchmarks/coordination_lua.py [--decisions 2000] [--lines 0]

Runs the admission function library (admission/coordination/lua) in a standalone Lua 5.1, the
Lua Redis embeds (Debian's `lua5.1` and `lua-cjson`), against an in-memory stand-in for the Redis
commands the functions call (coordination_lua.lua), with a hook that counts every VM instruction
by line. The calls are those of `coordination.py`'s decisions with each invocation forgotten, one
caller: the profile installed, then acquires of one principal, each giving the previous permit
back and forgetting the previous invocation (the common path). Prints the VM instructions per
acquire by function of the library and, with `--lines N`, the N lines that execute the most.
The stand-in's own instructions are left out. These are counts of the Lua code's own work, not
of Redis's commands or of the glue between them and Lua (coordination_instructions.py counts the
whole server's). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordination import profile

from admission.coordination import scripts
from admission.coordination.controller import profile_fields
from admission.coordination.protocol import Acquire, Header, Install, Release

HERE = Path(__file__).resolve().parent
WARM = 50


def lua_text(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode()
    return json.dumps("" if value is None else str(value))


def calls(decisions: int) -> list[tuple[str, list[object]]]:
    bench = profile()
    header = Header("bench", "bench", 3_600_000, "proc-1", 20_000, "", 0, 86_400_000).pack()
    install = Install(bench.profile_version, 1, bench.profile_digest, profile_fields(bench))
    out: list[tuple[str, list[object]]] = [
        (scripts.function_name("install"), header + install.pack())
    ]
    previous = None
    for index in range(WARM + decisions):
        request = f"decision-{index}"
        given = (Release(previous, True, None, 8, None, "p0", "llm"),) if previous else ()
        forgets = (f"invocation-{previous}",) if previous else ()
        acquire = Acquire(
            bench.profile_version, request, "p0", "llm", f"invocation-{request}", 10, None, 1,
            None, None, index > 0, True, given, forgets,
        )  # fmt: skip
        out.append((scripts.function_name("acquire"), header + acquire.pack()))
        previous = request
    return out


def owners(lines: list[str], library_lines: int) -> list[str]:
    """The function each line of the library belongs to (the entries after the library)."""
    owner, out = "(top level)", []
    for number, line in enumerate(lines, start=1):
        named = re.match(r"\s*local function (\w+)", line)
        entry = re.match(r"redis\.register_function\('(\w+)'", line)
        if named and number <= library_lines:
            owner = named.group(1)
        elif entry:
            owner = "entry " + entry.group(1).rsplit("_", 1)[-1]
        out.append(owner)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000)
    parser.add_argument("--lines", type=int, default=0, help="also the N busiest lines")
    args = parser.parse_args()
    lua = shutil.which("lua5.1")
    if lua is None:
        sys.exit("lua5.1 is not on the PATH (Debian: apt-get install lua5.1 lua-cjson)")
    code = scripts.library_code().split("\n", 1)[1]
    lines = code.splitlines()
    library_lines = len((scripts.LUA_DIR / "lib.lua").read_text(encoding="utf-8").splitlines())
    belongs = owners(lines, library_lines)
    with tempfile.TemporaryDirectory(prefix="sluice-lua-") as tmp:
        folder = Path(tmp)
        (folder / "library.lua").write_text(code, encoding="utf-8")
        with (folder / "calls.lua").open("w", encoding="utf-8") as out:
            out.write("return {\n")
            for name, arguments in calls(args.decisions):
                texts = ", ".join(lua_text(a) for a in arguments)
                out.write(f"{{{lua_text(name)}, {{{texts}}}}},\n")
            out.write("}\n")
        run = subprocess.run(
            [lua, str(HERE / "coordination_lua.lua"), "library.lua", "calls.lua", str(WARM + 1)],
            cwd=folder,
            capture_output=True,
            text=True,
            check=False,
        )
    if run.returncode != 0:
        sys.exit(f"the library failed outside Redis: {run.stderr.strip()}")
    by_function: Counter[str] = Counter()
    by_line: Counter[str] = Counter()
    counted = 1
    for row in run.stdout.splitlines():
        first, _, rest = row.partition("\t")
        if first == "answer":
            answer = json.loads(rest)
            if answer.get("st") != "admit":
                sys.exit(f"a decision was not admitted: {rest}")
        elif first == "calls":
            counted = int(rest)
        elif rest.startswith("library.lua:"):
            number = int(rest.rsplit(":", 1)[1])
            by_function[belongs[number - 1]] += int(first)
            by_line[f"{number:5d}  {lines[number - 1].strip()[:90]}"] += int(first)
    total = sum(by_function.values())
    print(f"{counted} acquires: {total / counted:,.0f} VM instructions per acquire")
    for name, n in by_function.most_common():
        print(f"{n / counted:10.1f}  {name}")
    if args.lines:
        print(f"the {args.lines} busiest lines (line numbers of the assembled library):")
        for line, n in by_line.most_common(args.lines):
            print(f"{n / counted:10.1f}  {line}")


if __name__ == "__main__":
    main()
