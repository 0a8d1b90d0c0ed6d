"""PostgreSQL and Redis servers of a test's own, on free ports in temporary directories, that the
test may stop and start again (the shared servers are never touched)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.service.conftest import free_port
from tests.service.conftest import wait_for as wait_until

__all__ = ["PrivatePostgres", "PrivateRedis"]


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
            found.append(int(entry.name))
    return found


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        pytest.skip("no PostgreSQL server binaries (initdb) on this machine")
    return Path(initdb).parent


class PrivatePostgres:
    """A throwaway PostgreSQL cluster; superuser `root`, trust authentication on 127.0.0.1."""

    def __init__(self) -> None:
        self.bin = _postgres_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
        self.data = self.dir / "data"
        # initdb and postgres refuse to run as root: as root, the cluster belongs to `postgres`.
        self._as: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "root", "--auth=trust", "-E", "UTF8")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "root", "sluice")

    @property
    def url(self) -> str:
        return f"postgres://root@127.0.0.1:{self.port}/sluice"

    def _run(self, tool: str, *argv: str) -> None:
        subprocess.run(
            [*self._as, str(self.bin / tool), *argv],
            check=True,
            capture_output=True,
            cwd=self.dir,
            timeout=120,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.dir / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        wait_until(lambda: answers(self.port), 30, "PostgreSQL to answer")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` ends every session first, `immediate` just kills them (the
        next start recovers from the write-ahead log, as after a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")
        wait_until(lambda: not answers(self.port), 30, "PostgreSQL to stop")

    def processes(self) -> list[int]:
        """The postmaster's pid followed by those of its children (backends and helpers)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        return [postmaster, *_children(postmaster)]

    def pause(self) -> list[int]:
        """Freeze the postmaster, then every backend and helper (SIGSTOP): connections stay
        open and new ones wait in the listen queue, but nothing is answered. Returns the frozen
        pids for `resume`."""
        frozen = []
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                frozen.append(pid)
        # A backend forked between the listing and the postmaster's freeze is frozen too.
        for pid in _children(frozen[0]):
            if pid not in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    frozen.append(pid)
        return frozen

    @staticmethod
    def resume(frozen: list[int]) -> None:
        """Thaw what `pause` froze (SIGCONT), children first."""
        for pid in reversed(frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def destroy(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.resume(self.processes())
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A throwaway Redis without persistence."""

    def __init__(self) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("no redis-server on this machine")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: answers(self.port), 30, "Redis to answer")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None
        wait_until(lambda: not answers(self.port), 30, "Redis to stop")

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing is answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw a paused server (SIGCONT): it runs what it was sent meanwhile."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def destroy(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
