"""A network partition for one worker: its own network namespace, a veth pair, a TCP forwarder.

PostgreSQL listens on 127.0.0.1 only, which a process in another network
namespace cannot reach. The least invasive path that needs no firewall rules
and no server change: a veth pair (``<name>h`` on the host, ``<name>n`` in the
namespace, a private /30 between them) and a small forwarder thread in the
scenario's own process, listening on the host end and relaying bytes to
127.0.0.1:5432. The worker in the namespace connects to the host end.

:meth:`Partition.cut` takes the host end of the link down: packets in both
directions are dropped, established TCP connections stay open and just stop
moving (as on a real partition: no reset, no error, the calls in flight
hang). :meth:`Partition.heal` brings it back up and the kernel retransmits
what was stuck. Everything is removed on exit, whatever happened.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import uuid


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str | None:
    """Why namespaces cannot be used here (``None`` when they can): no ``ip`` command, or the kernel refuses.

    Nothing is assumed from the user id: a probe namespace is created, and the
    kernel's own answer (e.g. "Operation not permitted" for a user without
    CAP_SYS_ADMIN) is the reason given.
    """
    probe = f"fqprobe{uuid.uuid4().hex[:6]}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "the ip command (iproute2) is not installed"
    if made.returncode != 0:
        return f"the kernel refuses network namespaces: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Forwarder:
    """Relay TCP connections from ``listen`` to ``target`` on threads until :meth:`close`."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        self.target = target
        self.server = socket.create_server(listen)
        self.address = self.server.getsockname()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.connections = 0
        threading.Thread(target=self._accept, name="fqchaos-forwarder", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        try:
            self.server.close()
        except OSError:
            pass
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class Partition:
    """A namespace whose processes reach PostgreSQL only through a link that can be cut.

    Use as a context manager. ``prefix`` runs a command inside the namespace;
    ``host``/``port`` are what that command must connect to.
    """

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5432)):
        tag = f"{os.getpid() % 100000:05d}"
        self.ns = f"fqchaos{tag}"
        self.host_if, self.ns_if = f"fqc{tag}h", f"fqc{tag}n"
        octet = os.getpid() % 250 + 1
        self.host, self.peer = f"10.213.{octet}.1", f"10.213.{octet}.2"
        self.target = target
        self.forwarder: Forwarder | None = None
        self.port = 0
        self.cuts = 0

    @property
    def prefix(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.ns)

    def __enter__(self) -> Partition:
        try:
            _ip("netns", "add", self.ns)
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.ns)
            _ip("addr", "add", f"{self.host}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.peer}/30", "dev", self.ns_if)
            _ip("-n", self.ns, "link", "set", self.ns_if, "up")
            _ip("-n", self.ns, "link", "set", "lo", "up")
            self.forwarder = Forwarder((self.host, 0), self.target)
            self.port = self.forwarder.address[1]
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def cut(self) -> None:
        """Drop every packet between the namespace and the host (connections stay open, stuck)."""
        _ip("link", "set", "dev", self.host_if, "down")
        self.cuts += 1

    def heal(self) -> None:
        """Let packets through again; stuck TCP connections resume on their next retransmission."""
        _ip("link", "set", "dev", self.host_if, "up")

    def __exit__(self, *exc) -> bool:
        if self.forwarder is not None:
            self.forwarder.close()
        _ip("link", "del", self.host_if, check=False)  # removes the peer too
        _ip("netns", "del", self.ns, check=False)
        return False
