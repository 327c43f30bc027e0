"""A throw-away etcd member and a two-node Patroni cluster of PostgreSQL 15 on loopback (the failover scenario).

Everything runs on 127.0.0.1 from Debian's packages (``patroni``,
``etcd-server``; ``.ci/run`` installs them when missing), in one temporary
directory: etcd on 2379/2380, the nodes on 5433/5434 with their REST APIs
on 8008/8009. :func:`unavailable` says why it cannot run here (not root, a
package missing, a port taken). :class:`Cluster` starts it (node1 first,
then node2 as its synchronous standby), injects the faults (``kill -9`` of
the primary's postmaster, ``patronictl switchover``) and stops every process
it started, by pid, in :meth:`Cluster.stop` (also after a failed start).

Timings are Patroni's "fast" ones (ttl 10 s, loop_wait 2 s, retry_timeout
4 s) with ``primary_start_timeout: 0``, so a crashed primary fails over to
the sync standby instead of being restarted in place. No module of Django
is imported here: the scenario's own process connects to the cluster
(:mod:`tests.chaos.failover`).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ETCD_PORTS = (2379, 2380)
PG_PORTS = (5433, 5434)
REST_PORTS = (8008, 8009)
BIN_DIR = "/usr/lib/postgresql/15/bin"
SCOPE = "fqha"
NODES = ("node1", "node2")


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def unavailable() -> str | None:
    """Why the cluster cannot be started on this machine (``None``: it can)."""
    if os.geteuid() != 0:
        return "the Patroni scenario runs PostgreSQL as the postgres user: it needs root"
    for tool in ("patroni", "patronictl", "etcd", "setpriv"):
        if not shutil.which(tool):
            return f"{tool} not installed (Debian packages patroni, etcd-server; .ci/run installs them)"
    if not os.access(f"{BIN_DIR}/postgres", os.X_OK):
        return f"no PostgreSQL 15 server binaries in {BIN_DIR}"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres system user"
    taken = [p for p in (*ETCD_PORTS, *PG_PORTS, *REST_PORTS) if _port_taken(p)]
    if taken:
        return f"ports already in use on 127.0.0.1: {taken}"
    return None


def _node_yaml(base: Path, i: int) -> str:
    name, pg, rest = NODES[i], PG_PORTS[i], REST_PORTS[i]
    data = base / name
    return f"""scope: {SCOPE}
name: {name}
restapi:
  listen: 127.0.0.1:{rest}
  connect_address: 127.0.0.1:{rest}
etcd3:
  hosts: 127.0.0.1:{ETCD_PORTS[0]}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 2
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    primary_start_timeout: 0
    master_start_timeout: 0
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        max_connections: 200
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}/data
  bin_dir: {BIN_DIR}
  pgpass: {data}/pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: replicator
  parameters:
    unix_socket_directories: {data}
    max_connections: 200
"""


def _pg(port: int, sql: str, dbname: str = "postgres", timeout: float = 2.0):
    """One statement on one node (autocommit, psycopg 3); returns the first row or raises."""
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=dbname, connect_timeout=int(max(1, timeout)),
                         autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchone() if cur.description else None


class Cluster:
    """etcd + node1 + node2 under ``base`` (a new temporary directory when ``None``)."""

    def __init__(self, base: Path | None = None):
        self.base = Path(base or tempfile.mkdtemp(prefix="fq-patroni-"))
        self.base.chmod(0o755)  # postgres must traverse it
        (self.base / "log").mkdir(exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}

    # --- start and stop ------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> None:
        """Start etcd, node1 (the leader), node2; return once node2 is the synchronous standby."""
        give_up = time.monotonic() + timeout
        etcd_dir = self.base / "etcd"
        etcd_dir.mkdir(exist_ok=True)
        url_c, url_p = f"http://127.0.0.1:{ETCD_PORTS[0]}", f"http://127.0.0.1:{ETCD_PORTS[1]}"
        self._spawn("etcd", ["etcd", "--name", SCOPE, "--data-dir", str(etcd_dir / "data"),
                             "--listen-client-urls", url_c, "--advertise-client-urls", url_c,
                             "--listen-peer-urls", url_p, "--initial-advertise-peer-urls", url_p,
                             "--initial-cluster", f"{SCOPE}={url_p}"], as_postgres=False)
        self._until(lambda: _port_taken(ETCD_PORTS[0]), give_up, "etcd to listen")
        pw = pwd.getpwnam("postgres")
        for i, name in enumerate(NODES):
            d = self.base / name
            d.mkdir(exist_ok=True)
            os.chown(d, pw.pw_uid, pw.pw_gid)
            d.chmod(0o700)
            cfg = self.base / f"{name}.yml"
            cfg.write_text(_node_yaml(self.base, i))
            cfg.chmod(0o644)
        self.start_node(0)
        self._until(lambda: self.rest(0, "primary") == 200, give_up, "node1 to become the leader")
        self.start_node(1)
        self.wait_healthy(max(1.0, give_up - time.monotonic()))

    def start_node(self, i: int) -> None:
        """Start (or restart) the Patroni of node ``i`` (0 or 1) as the postgres user."""
        self._spawn(NODES[i], ["/usr/bin/patroni", str(self.base / f"{NODES[i]}.yml")], as_postgres=True)

    def _spawn(self, name: str, argv: list[str], *, as_postgres: bool) -> None:
        if as_postgres:
            # setpriv execs, so the pid is Patroni's own; env -i drops root's HOME and friends.
            argv = ["env", "-i", "PATH=/usr/bin:/bin", "LANG=C.UTF-8", f"HOME={self.base / name}",
                    "setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]
        with open(self.base / "log" / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, cwd=self.base, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        """Stop everything this cluster started (the standby first, then the leader, then etcd), by pid; remove its files."""
        leader = self.leader_index()
        order = (1 - (leader or 0), leader or 0)
        for i in order:
            self._stop_proc(NODES[i], timeout=30)
            self._kill_postmaster(i)  # orphaned when its Patroni had to be killed
        self._stop_proc("etcd", timeout=10)
        shutil.rmtree(self.base, ignore_errors=True)

    def _stop_proc(self, name: str, timeout: float) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    # --- state -----------------------------------------------------------------------------------------

    def rest(self, i: int, path: str) -> int:
        """HTTP status of Patroni's REST ``/path`` on node ``i`` (0 when it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{REST_PORTS[i]}/{path}", timeout=1) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (OSError, urllib.error.URLError):
            return 0

    def members(self) -> list[dict]:
        """``patronictl list`` as JSON rows (Member, Host, Role, State, TL, Lag in MB)."""
        done = subprocess.run(["patronictl", "-c", str(self.base / "node1.yml"), "list", "-f", "json"],
                              capture_output=True, text=True, timeout=30)
        try:
            return json.loads(done.stdout or "[]")
        except json.JSONDecodeError:
            return []

    def leader_index(self) -> int | None:
        for i in range(len(NODES)):
            if self.rest(i, "primary") == 200:
                return i
        return None

    def writable_port(self) -> int | None:
        """The port of the node that accepts writes now (asked of PostgreSQL itself), ``None`` if neither does."""
        for port in PG_PORTS:
            try:
                if _pg(port, "SELECT NOT pg_is_in_recovery()", timeout=1)[0]:
                    return port
            except Exception:  # down, starting, refusing
                continue
        return None

    def wait_healthy(self, timeout: float = 90.0) -> None:
        """Wait until one node is Leader and the other Sync Standby, streaming (before any fault)."""
        give_up = time.monotonic() + timeout

        def healthy() -> bool:
            roles = sorted(m.get("Role", "") for m in self.members() if m.get("State") in ("running", "streaming"))
            return roles == ["Leader", "Sync Standby"]

        self._until(healthy, give_up, "a leader and a sync standby")

    def _until(self, predicate, give_up: float, what: str) -> None:
        while not predicate():
            if time.monotonic() > give_up:
                raise RuntimeError(f"Patroni cluster: timed out waiting for {what}; members {self.members()}; "
                                   f"logs in {self.base / 'log'}:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, chars: int = 2500) -> str:
        parts = []
        for f in sorted((self.base / "log").glob("*.log")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    # --- faults ----------------------------------------------------------------------------------------

    def postmaster_pid(self, i: int) -> int | None:
        try:
            return int((self.base / NODES[i] / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _kill_postmaster(self, i: int) -> None:
        pid = self.postmaster_pid(i)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill_primary(self) -> int:
        """``kill -9`` the leader's postmaster (Patroni stays up and fails over); returns the old primary's port."""
        i = self.leader_index()
        if i is None:
            raise RuntimeError("no leader to kill")
        pid = self.postmaster_pid(i)
        if not pid:
            raise RuntimeError(f"no postmaster.pid on {NODES[i]}")
        os.kill(pid, signal.SIGKILL)
        return PG_PORTS[i]

    def switchover(self) -> int:
        """``patronictl switchover --force`` to the sync standby; returns the old primary's port."""
        i = self.leader_index()
        if i is None:
            raise RuntimeError("no leader to switch over from")
        done = subprocess.run(["patronictl", "-c", str(self.base / "node1.yml"), "switchover", "--force"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"patronictl switchover failed: {(done.stderr or done.stdout).strip()[-800:]}")
        return PG_PORTS[i]

    def wait_new_primary(self, old_port: int, timeout: float = 60.0) -> tuple[int, float]:
        """Wait until the other node accepts writes; return its port and ``time.time()`` of that moment."""
        other = next(p for p in PG_PORTS if p != old_port)
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            try:
                if _pg(other, "SELECT NOT pg_is_in_recovery()", timeout=1)[0]:
                    return other, time.time()
            except Exception:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"no new primary on {other} {timeout:.0f} s after the fault; members {self.members()}\n{self.log_tail()}")

    # --- the database under test -----------------------------------------------------------------------

    def create_database(self, name: str) -> None:
        port = self.writable_port()
        if port is None:
            raise RuntimeError("no writable node to create the database on")
        _pg(port, f'DROP DATABASE IF EXISTS "{name}"')
        _pg(port, f'CREATE DATABASE "{name}"')

    @staticmethod
    def env() -> dict[str, str]:
        """The test settings' variables (tests/settings.py) that reach the cluster's primary through libpq multi-host."""
        return {
            "FQ_TEST_DB": "postgres",
            "FQ_TEST_PG_HOST": ",".join("127.0.0.1" for _ in PG_PORTS),
            "FQ_TEST_PG_PORT": ",".join(str(p) for p in PG_PORTS),
            "FQ_TEST_PG_TARGET_SESSION_ATTRS": "read-write",
            "FQ_TEST_PG_CONNECT_TIMEOUT": "2",
        }
