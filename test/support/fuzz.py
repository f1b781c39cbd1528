"""Hostile connections to the TCP ports a job listens on (issue 59), for
test/python/test_security.py and benchmarks/fuzz_ports.py.

PortFuzzer lists, every 5 ms, the listening TCP sockets of a process and
every process under it (holdfast-run's controller; the members' Gloo pair
and backup-link listeners, open while a generation is being built), and
on each port it finds it opens connections that send
  random:  4 KiB of random bytes, then close;
  h2:      HTTP/2's client preface, then 1 KiB of random bytes;
  hello:   a backup link's magic (HFBULK02) and random bytes;
  silent:  nothing, held open until the fuzzer stops."""

import os
import pathlib
import re
import socket
import threading
import time

from jobs import descendants

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
KINDS = ("random", "h2", "hello", "silent")


def listening_ports(pid):
    """The TCP ports process `pid` listens on (its socket inodes matched
    against /proc/PID/net/tcp and tcp6)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    for fd in fds:
        try:
            m = re.match(r"socket:\[(\d+)\]",
                         os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = pathlib.Path(f"/proc/{pid}/net/{table}").read_text()
        except OSError:
            continue
        for row in rows.splitlines()[1:]:
            f = row.split()
            if f[3] == "0A" and f[9] in inodes:  # TCP_LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def attack(port, kind, held):
    """One hostile connection of `kind` to 127.0.0.1:`port` (a silent one
    goes into `held`); False when it could not connect."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
    except OSError:
        return False
    if kind == "silent":
        held.append(s)
        return True
    payload = {"random": os.urandom(4096),
               "h2": PREFACE + os.urandom(1024),
               "hello": b"HFBULK02" + os.urandom(64)}[kind]
    try:
        s.sendall(payload)
    except OSError:
        pass
    s.close()
    return True


def _owner(pid):
    try:
        name = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"
    return "controller" if name == "holdfast-run" else "member"


class PortFuzzer:
    """Attacks the ports of `root` and the processes under it, on a thread
    of its own, from start() to stop(). `hits`: owner ("controller" for
    holdfast-run, else "member") -> port -> connections made."""

    def __init__(self, root):
        self.root = root
        self.hits = {}
        self._held = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        for s in self._held:
            s.close()
        self._held.clear()
        return self.hits

    def connections(self, owner=None):
        return sum(n for o, ports in self.hits.items()
                   if owner in (None, o) for n in ports.values())

    def _run(self):
        while not self._stop.is_set():
            for pid in [self.root] + descendants(self.root):
                for port in listening_ports(pid):
                    for kind in KINDS:
                        if attack(port, kind, self._held):
                            ports = self.hits.setdefault(_owner(pid), {})
                            ports[port] = ports.get(port, 0) + 1
            time.sleep(0.005)
