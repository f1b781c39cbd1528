"""Hostile connections to the TCP ports and Unix sockets a job listens on
(issue 59), for test/python/test_jobs.py, test/agent/test_agent.py and
benchmarks/fuzz_ports.py.

PortFuzzer lists, every 5 ms, the listening TCP and Unix sockets of some
processes and every process under them (holdfast-run's or
holdfast-controller's controller and metrics ports; host agents' sockets;
the members' Gloo pair and backup-link listeners, open while a generation
is being built), and on each one it finds it opens connections that send
  random:  4 KiB of random bytes, then close;
  h2:      HTTP/2's client preface, then 1 KiB of random bytes;
  hello:   a backup link's magic (HFBULK02) and random bytes;
  gloo:    a Gloo link's hello (HFGLOO01, a generation and ranks of a
           small job, the port, a fresh nonce) and a random proof;
  replay:  the hello and proof of a real handshake (a Gloo pair's or a
           backup link's) that HandshakeRecorder saw on the loopback
           interface earlier in the job, sent again as they were;
  silent:  nothing, held open until the fuzzer stops (at most
           SILENT_PER_TARGET to each).
Replays need root (a packet socket on lo); without it there are none, and
`recorder.error` says why."""

import os
import pathlib
import re
import random
import socket
import struct
import threading
import time

from jobs import descendants

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
KINDS = ("random", "h2", "hello", "gloo", "replay", "silent")
# Silent connections opened to one port or socket over the fuzzer's run
# (held until it stops, unless the listener closes them first): enough to
# fill a listener's handshakes in progress (16 for Gloo pairs and backup
# links); more only grow the socket tables each pass reads.
SILENT_PER_TARGET = 16
# A handshake's hello starts with its magic; the connecting side's next
# message is its proof (an HMAC-SHA256).
HELLO_SIZES = {b"HFGLOO01": 48, b"HFBULK02": 48}
PROOF_SIZE = 32
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


class HandshakeRecorder:
    """Records the hellos and proofs of real link handshakes on the
    loopback interface (a packet socket: needs root), on a thread of its
    own. `recorded`: (hello, proof) byte pairs, newest last."""

    def __init__(self):
        self.recorded = []
        self.error = None
        self._hellos = {}  # flow -> its hello, until its proof comes
        self._stop = threading.Event()
        try:
            self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                                       socket.htons(ETH_P_ALL))
            self._sock.bind(("lo", 0))
            self._sock.settimeout(0.1)
        except OSError as e:
            self._sock = None
            self.error = f"no packet socket on lo: {e}"
            return
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._sock is not None:
            self._thread.join()
            self._sock.close()

    def _run(self):
        while not self._stop.is_set():
            try:
                frame, addr = self._sock.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if addr[2] != PACKET_OUTGOING:  # lo shows each one twice
                self._take(frame)

    def _take(self, frame):
        """Files the TCP payload of one Ethernet frame."""
        if len(frame) < 34 or frame[12:14] != b"\x08\x00":  # IPv4
            return
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 6:  # TCP
            return
        tcp = ip[ihl:]
        if len(tcp) < 20:
            return
        payload = tcp[(tcp[12] >> 4) * 4:]
        if not payload:
            return
        flow = (ip[12:16], ip[16:20], tcp[0:4])
        size = HELLO_SIZES.get(payload[:8])
        if size is not None and len(payload) >= size:
            self._hellos[flow] = payload[:size]
            rest = payload[size:]
            if len(rest) >= PROOF_SIZE:  # hello and proof in one segment
                self.recorded.append((payload[:size], rest[:PROOF_SIZE]))
                self._hellos.pop(flow)
        elif flow in self._hellos and len(payload) >= PROOF_SIZE:
            self.recorded.append((self._hellos.pop(flow),
                                  payload[:PROOF_SIZE]))
        self.recorded = self.recorded[-16:]


def gloo_hello(port):
    """A plausible Gloo link hello for `port` and a random proof."""
    return (b"HFGLOO01" + struct.pack("<qiiII", random.randrange(4),
                                      random.randrange(5), random.randrange(5),
                                      port, 0)
            + os.urandom(16) + os.urandom(PROOF_SIZE))


def _socket_inodes(pid):
    """The inodes of the sockets process `pid` has open."""
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
    return inodes


def listening_sockets(pid):
    """The listening TCP and Unix stream sockets of process `pid`'s network
    namespace (/proc/PID/net/tcp, tcp6 and unix): socket inode -> port, or
    -> path for a Unix socket (a host agent's, for one)."""
    found = {}
    for table in ("tcp", "tcp6"):
        try:
            rows = pathlib.Path(f"/proc/{pid}/net/{table}").read_text()
        except OSError:
            continue
        for row in rows.splitlines()[1:]:
            f = row.split()
            if f[3] == "0A":  # TCP_LISTEN
                found[f[9]] = int(f[1].rsplit(":", 1)[1], 16)
    try:
        rows = pathlib.Path(f"/proc/{pid}/net/unix").read_text()
    except OSError:
        rows = ""
    for row in rows.splitlines()[1:]:
        f = row.split()
        # Flags __SO_ACCEPTCON: listening; a path, not an abstract name.
        if len(f) >= 8 and int(f[3], 16) & 0x10000 and f[7].startswith("/"):
            found[f[6]] = f[7]
    return found


def _netns(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def attack(target, kind, held, recorded=()):
    """One hostile connection of `kind` to 127.0.0.1:`target` (a port), or
    to the Unix socket at path `target` (a silent one goes into `held`);
    False when it could not connect, or when a replay has nothing recorded
    to replay."""
    if kind == "replay":
        if not recorded:
            return False
        hello, proof = recorded[-1]
        payload = hello + proof
    try:
        if isinstance(target, str):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(0.5)
            s.connect(target)
        else:
            s = socket.create_connection(("127.0.0.1", target), timeout=0.5)
    except OSError:
        return False
    if kind == "silent":
        held.append(s)
        return True
    if kind != "replay":
        payload = {"random": lambda: os.urandom(4096),
                   "h2": lambda: PREFACE + os.urandom(1024),
                   "hello": lambda: b"HFBULK02" + os.urandom(64),
                   "gloo": lambda: gloo_hello(
                       0 if isinstance(target, str) else target)}[kind]()
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
    if name in ("holdfast-run", "holdfast-contro"):  # comm: 15 characters
        return "controller"
    return "agent" if name == "holdfast-agent" else "member"


class PortFuzzer:
    """Attacks the TCP ports and Unix sockets of the processes `roots` and
    the processes under them, on a thread of its own, from start() to
    stop(). `hits`: owner ("controller" for holdfast-run and
    holdfast-controller, "agent" for holdfast-agent, else "member") ->
    port or socket path -> connections made; `replays`: recorded
    handshakes replayed."""

    def __init__(self, *roots):
        self.roots = roots
        self.hits = {}
        self.replays = 0
        self.cycles = 0  # passes over every listening socket
        self.slowest_ms = 0.0  # the longest pass
        self.recorder = None
        self._held = []
        self._silent = {}  # target -> silent connections opened to it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.recorder = HandshakeRecorder()
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.recorder.stop()
        for s in self._held:
            s.close()
        self._held.clear()
        return self.hits

    def connections(self, owner=None):
        return sum(n for o, ports in self.hits.items()
                   if owner in (None, o) for n in ports.values())

    def _targets(self):
        """(owner, port or path) of every socket the processes listen on,
        those hit least so far first: a member's listeners are open only
        while its generation is built. The socket tables are read once per
        network namespace: read once per process, they took a cycle 300 ms
        on a loaded 2-core machine, longer than a generation's build."""
        tables = {}
        targets = []
        for pid in [p for r in self.roots for p in [r] + descendants(r)]:
            ns = _netns(pid)
            if ns is None:
                continue
            if ns not in tables:
                tables[ns] = listening_sockets(pid)
            owner = None
            for inode in _socket_inodes(pid):
                if inode in tables[ns]:
                    owner = owner or _owner(pid)
                    targets.append((owner, tables[ns][inode]))
        return sorted(targets,
                      key=lambda t: self.hits.get(t[0], {}).get(t[1], 0))

    def _run(self):
        while not self._stop.is_set():
            start = time.monotonic()
            for owner, target in self._targets():
                held = self._silent.get(target, 0)
                for kind in KINDS:
                    if kind == "silent" and held >= SILENT_PER_TARGET:
                        continue
                    if attack(target, kind, self._held,
                              self.recorder.recorded):
                        self.replays += kind == "replay"
                        held += kind == "silent"
                        hit = self.hits.setdefault(owner, {})
                        hit[target] = hit.get(target, 0) + 1
                self._silent[target] = held
            self.cycles += 1
            self.slowest_ms = max(self.slowest_ms,
                                  (time.monotonic() - start) * 1000)
            time.sleep(0.005)
