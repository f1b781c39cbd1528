"""Test hosts on one machine: network namespaces joined by veth pairs.

Each test host is a namespace `hfnet<run>-<name>` with two links, as a
cluster node has:
  eth-d  the data network (bridge hfb<run>d, 10.<N>.0.0/24): the members'
         collectives and backup links bind here (HOLDFAST_BIND_ADDR)
  eth-c  the control network (bridge hfb<run>c, 10.<N>.1.0/24): the
         controller is reached here (HOLDFAST_CONTROLLER)
where <run> is the test process's pid and N = 100 + pid % 100, or the next
N that no other run's bridge holds, so that two runs on one machine do not
meet (a benchmark beside the tests, or two runs by hand). The
controller's host is on the control network only. The root namespace
holds the bridges (with .254 on each), so the test reaches every host.

Cutting a link sets the bridge's end of the veth pair down: packets are
dropped silently, as with a pulled cable or a dead switch port, and
nobody's sockets see an error. iproute2 from Debian (scripts/setup.sh).
Needs CAP_NET_ADMIN (root); `available()` says why not otherwise.
"""

import fcntl
import os
import re
import subprocess
import tempfile
import time

RUN = os.getpid()
PREFIX = f"hfnet{RUN}"
# This run's subnets: set by TestNet (_claim_nets).
NETS = {}


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def available():
    """None when test hosts can be made here, else why not."""
    if os.geteuid() != 0:
        return "test hosts need root (CAP_NET_ADMIN for ip netns and veth)"
    try:
        subprocess.run(["ip", "-V"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "iproute2's ip is not installed"
    probe = f"{PREFIX}-probe"
    _ip("netns", "del", probe, check=False)
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cleanup(run=RUN):
    """Removes the test hosts, links and bridges of run `run` and of runs
    whose process is gone (a failed or killed test), and kills the
    processes left in their namespaces."""
    def stale(owner):
        return owner.isdigit() and (int(owner) == run or not _alive(int(owner)))

    for line in _ip("netns", "list", check=False).stdout.split("\n"):
        name = line.split(" ")[0]
        if not name.startswith("hfnet") or "-" not in name:
            continue
        if not stale(name[len("hfnet"):name.index("-")]):
            continue
        for pid in _ip("netns", "pids", name, check=False).stdout.split():
            try:
                os.kill(int(pid), 9)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        m = re.fullmatch(r"(?:hfb(\d+)[dc]|hv(\d+)[dc]\d+)", name)
        if m and stale(m.group(1) or m.group(2)):
            _ip("link", "del", name, check=False)


class Host:
    """One test host: `ns`, its addresses on each network (`addr["d"]`,
    `addr["c"]`) and the root-side ends of its links (`veth["d"]`, ...)."""

    def __init__(self, name, index, nets):
        self.name = name
        self.ns = f"{PREFIX}-{name}"
        self.addr = {n: f"{NETS[n]}.{10 + index}" for n in nets}
        self.veth = {n: f"hv{RUN}{n}{index}" for n in nets}

    def exec_prefix(self):
        return ["ip", "netns", "exec", self.ns]

    def set_link(self, up, nets=("d", "c")):
        """Cuts or restores this host's links. A restore returns once the
        kernel has brought the host's end up (its operational state, which
        the kernel's link watch sets, up to a second later and longer
        while other namespaces are being torn down): until then what the
        host sends is dropped, and a connect made at once can fail with No
        route to host."""
        links = [n for n in nets if n in self.veth]
        for n in links:
            _ip("link", "set", self.veth[n], "up" if up else "down")
        if not up:
            return
        deadline = time.monotonic() + 10
        for n in links:
            while "state UP" not in _ip("-n", self.ns, "-o", "link", "show",
                                        f"eth-{n}").stdout:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.name}'s eth-{n} is not up 10 s after its "
                        "link was restored")
                time.sleep(0.02)

    def block(self, addrs):
        """Drops every packet between this host and `addrs` (nftables in
        its namespace, both ways); block([]) lifts it."""
        nft = self.exec_prefix() + ["nft"]
        subprocess.run(nft + ["delete", "table", "inet", "hf"],
                       stderr=subprocess.DEVNULL, check=False)
        if not addrs:
            return
        rules = "\n".join(
            ["table inet hf {",
             " chain out { type filter hook output priority 0; policy accept;"]
            + [f"  ip daddr {a} drop" for a in addrs]
            + [" }",
               " chain in { type filter hook input priority 0; policy accept;"]
            + [f"  ip saddr {a} drop" for a in addrs]
            + [" }", "}"])
        subprocess.run(nft + ["-f", "-"], input=rules, text=True, check=True)


    def lossy(self, percent, net="d"):
        """Drops `percent` % of the packets on this host's link `net`, in
        both directions, at random (nftables' numgen in its namespace, as a
        bad cable or an overrun switch port loses them); lossy(0) lifts it.
        """
        nft = self.exec_prefix() + ["nft"]
        subprocess.run(nft + ["delete", "table", "inet", "hfloss"],
                       stderr=subprocess.DEVNULL, check=False)
        if percent <= 0:
            return
        dev = f"eth-{net}"
        rules = "\n".join([
            "table inet hfloss {",
            " chain out { type filter hook output priority 0; policy accept;",
            f"  oifname \"{dev}\" numgen random mod 100 < {percent} drop",
            " }",
            " chain in { type filter hook input priority 0; policy accept;",
            f"  iifname \"{dev}\" numgen random mod 100 < {percent} drop",
            " }", "}"])
        subprocess.run(nft + ["-f", "-"], input=rules, text=True, check=True)


def _claim_nets():
    """The subnets of this run's networks: 10.N.0 and 10.N.1 for the first
    N from 100 + pid % 100 on (modulo 100) that no bridge of another run
    holds. The caller holds the machine's lock until its bridges exist."""
    held = set(re.findall(r"inet 10\.(\d+)\.[01]\.254/",
                          _ip("-o", "addr", "show", check=False).stdout))
    for k in range(100):
        n = 100 + (RUN + k) % 100
        if str(n) not in held:
            return {"d": f"10.{n}.0", "c": f"10.{n}.1"}
    raise RuntimeError("test hosts: every subnet 10.100-199.0.0/16 is held "
                       "by another run's bridges")


class TestNet:
    """Bridges and test hosts. `hosts`: [(name, nets)], nets a subset of
    "dc". Idempotent: it removes what an earlier run left first."""

    def __init__(self, hosts):
        cleanup()
        # One run at a time picks its subnets and makes its bridges.
        lock = os.path.join(tempfile.gettempdir(), "holdfast-netns.lock")
        with open(lock, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            NETS.clear()
            NETS.update(_claim_nets())
            for n, prefix in NETS.items():
                br = f"hfb{RUN}{n}"
                _ip("link", "add", br, "type", "bridge")
                _ip("addr", "add", f"{prefix}.254/24", "dev", br)
                _ip("link", "set", br, "up")
        self.hosts = {}
        for i, (name, nets) in enumerate(hosts):
            h = Host(name, i, nets)
            _ip("netns", "add", h.ns)
            _ip("-n", h.ns, "link", "set", "lo", "up")
            for n in nets:
                inner = f"eth-{n}"
                _ip("link", "add", h.veth[n], "type", "veth", "peer", "name",
                    inner, "netns", h.ns)
                _ip("link", "set", h.veth[n], "master", f"hfb{RUN}{n}")
                _ip("link", "set", h.veth[n], "up")
                _ip("-n", h.ns, "addr", "add", f"{h.addr[n]}/24", "dev", inner)
                _ip("-n", h.ns, "link", "set", inner, "up")
            self.hosts[name] = h

    def close(self):
        cleanup()
