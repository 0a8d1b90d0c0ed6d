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

__all__ = ["PrivatePostgres", "PrivateRedis", "PrivateRedisCluster"]


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


def _cluster_ports(count: int) -> list[int]:
    """Free ports whose cluster bus ports (port + 10000) are free too."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class PrivateRedisCluster:
    """A throwaway Redis Cluster on loopback: `primaries` primaries, each with `replicas`
    replicas (one or none), no persistence. A test may stop a primary (`kill`) and promote its
    replica (`promote`) or wait for the cluster to (`wait_promoted`), add an empty primary
    (`add_node`) and move a hash slot from one primary to another (`begin_migration`,
    `migrate_keys`, `end_migration`). `full_coverage` is `cluster-require-full-coverage`."""

    def __init__(
        self,
        primaries: int = 3,
        *,
        node_timeout_ms: int = 2000,
        replicas: int = 1,
        full_coverage: bool = True,
    ) -> None:
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            pytest.skip("no redis-server / redis-cli on this machine")
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-redis-cluster-"))
        self.ports = _cluster_ports((1 + replicas) * primaries)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.node_timeout_ms = node_timeout_ms
        self.full_coverage = full_coverage
        try:
            for port in self.ports:
                self._start(port)
            nodes = [f"127.0.0.1:{port}" for port in self.ports]
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *nodes,
                    "--cluster-replicas",
                    str(replicas),
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            for port in self.ports:
                wait_until(lambda port=port: self._ok(port), 60, "the Redis Cluster to be ok")
            # Every replica has finished its first sync (a promotion then loses nothing but the
            # writes of its last moments).
            wait_until(self._replicas_synced, 60, "the cluster's replicas to sync")
        except BaseException:
            self.destroy()
            raise

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def _start(self, port: int) -> None:
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1"]
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
        argv += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        argv += ["--cluster-require-full-coverage", "yes" if self.full_coverage else "no"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        log = str(self.dir / f"redis-{port}.log")
        argv += ["--logfile", log]
        self.processes[port] = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(lambda: answers(port), 30, "a cluster node to answer")

    def cli(self, port: int, *argv: str) -> str:
        done = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *argv],
            capture_output=True,
            timeout=30,
            check=False,
        )
        return done.stdout.decode("utf-8", "replace")

    def _ok(self, port: int) -> bool:
        return "cluster_state:ok" in self.cli(port, "cluster", "info")

    def _replicas_synced(self) -> bool:
        for port in self.live_ports():
            info = self.cli(port, "info", "replication")
            if "role:slave" in info and "master_link_status:up" not in info:
                return False
        return True

    def live_ports(self) -> list[int]:
        return [port for port, process in self.processes.items() if process.poll() is None]

    def primaries(self) -> list[int]:
        """Ports of the live primaries."""
        return [port for port in self.live_ports() if self._role(port) == "master"]

    def _role(self, port: int) -> str:
        return self.cli(port, "role").split("\n", 1)[0].strip()

    def primary_of(self, key: str) -> int:
        """The port of the primary serving a key's hash slot now."""
        from redis.cluster import key_slot

        slot = key_slot(key.encode("utf-8"))
        for line in self.cli(self.live_ports()[0], "cluster", "nodes").splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise AssertionError(f"no primary serves slot {slot}")

    def replica_of(self, primary: int) -> int:
        node_id = self.cli(primary, "cluster", "myid").strip()
        for line in self.cli(primary, "cluster", "nodes").splitlines():
            fields = line.split()
            if len(fields) > 3 and fields[3] == node_id:
                return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise AssertionError(f"no replica of {primary}")

    def kill(self, port: int) -> None:
        """Stop a node at once (SIGKILL): it answers nothing and keeps nothing."""
        process = self.processes[port]
        process.kill()
        process.wait(timeout=30)

    def pause(self, port: int) -> None:
        """Freeze a node (SIGSTOP): a replica then misses what its primary writes meanwhile."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        self.processes[port].send_signal(signal.SIGCONT)

    def promote(self, replica: int) -> None:
        """Make a replica the primary of its slots now (its primary is gone: no agreement)."""
        self.cli(replica, "cluster", "failover", "takeover")
        wait_until(lambda: self._role(replica) == "master", 30, "the promotion")
        for port in self.live_ports():
            wait_until(lambda port=port: self._ok(port), 60, "the cluster to be ok again")

    def wait_promoted(self, replica: int, timeout: float = 60) -> None:
        """Wait for the cluster itself to promote a replica whose primary failed (after
        `cluster-node-timeout`), and for every live node to be ok again."""
        wait_until(lambda: self._role(replica) == "master", timeout, "the automatic failover")
        for port in self.live_ports():
            wait_until(lambda port=port: self._ok(port), timeout, "the cluster to be ok again")

    def state(self, port: int) -> str:
        """`ok` or `fail`: the cluster's state as one node sees it."""
        for line in self.cli(port, "cluster", "info").splitlines():
            if line.startswith("cluster_state:"):
                return line.split(":", 1)[1].strip()
        return ""

    def sees_failed(self, observer: int, port: int) -> bool:
        """Whether `observer` has flagged the node at `port` as failed (after the node timeout,
        once the primaries agree)."""
        for line in self.cli(observer, "cluster", "nodes").splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[1].split("@")[0].endswith(f":{port}"):
                return "fail" in fields[2].split(",")
        return False

    def node_id(self, port: int) -> str:
        return self.cli(port, "cluster", "myid").strip()

    def add_node(self) -> int:
        """Start an empty node and make it a primary of the cluster (no slots yet): what a
        new shard looks like before slots are moved to it. Returns its port."""
        (port,) = _cluster_ports(1)
        self.ports.append(port)
        self._start(port)
        self.cli(self.live_ports()[0], "cluster", "meet", "127.0.0.1", str(port))
        ids = {other: self.node_id(other) for other in self.live_ports()}
        for other in ids:
            wait_until(
                lambda other=other: all(
                    i in self.cli(other, "cluster", "nodes") for i in ids.values()
                ),
                60,
                "every node to know every other",
            )
        wait_until(lambda: self._ok(port), 60, "the new node to see the cluster ok")
        return port

    def begin_migration(self, slot: int, source: int, target: int) -> None:
        """Mark a slot as leaving `source` for `target` (CLUSTER SETSLOT MIGRATING/IMPORTING):
        from now on a key of the slot missing on the source is asked of the target (ASK)."""
        self._checked(target, "cluster", "setslot", str(slot), "importing", self.node_id(source))
        self._checked(source, "cluster", "setslot", str(slot), "migrating", self.node_id(target))

    def migrate_keys(self, slot: int, source: int, target: int, count: int) -> int:
        """Move up to `count` keys of the slot from `source` to `target` (MIGRATE); returns
        how many moved."""
        keys = self.cli(source, "cluster", "getkeysinslot", str(slot), str(count)).split()
        if keys:
            self._checked(
                source, "migrate", "127.0.0.1", str(target), "", "0", "5000", "keys", *keys
            )
        return len(keys)

    def end_migration(self, slot: int, target: int) -> None:
        """Give the slot to `target` on every primary (CLUSTER SETSLOT NODE), target first."""
        target_id = self.node_id(target)
        ordered = [target, *(p for p in self.primaries() if p != target)]
        for port in ordered:
            self._checked(port, "cluster", "setslot", str(slot), "node", target_id)

    def _checked(self, port: int, *argv: str) -> str:
        reply = self.cli(port, *argv)
        if reply.startswith(("ERR", "NOKEY")) or "ERR" in reply.split("\n", 1)[0]:
            raise AssertionError(f"{' '.join(argv)} on {port}: {reply}")
        return reply

    def destroy(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
