"""Controller failover on etcd (docs/multi-node.md, "Controller failover").

Test hosts (test/network/netns.py): e0, e1, e2 on the control network run
a 3-member etcd cluster (Debian's etcd-server); c0 and c1 each run a
holdfast-controller with --etcd, and only the elected leader listens;
h0, h1, h2 each run the same multi-node holdfast-run (2 workers and a
standby per node) with --rdzv-endpoint c0:PORT,c1:PORT. Each case ends
with the fault-free hash on all 6 slots, and no member fenced.
"""

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import netns  # noqa: E402
from test_multinode import (BUILD, FINAL, PER_NODE, STEPS, WORLD,  # noqa: E402
                            Nodes, trainer)

TOKEN = "multinode-test-token"  # test_multinode.Nodes' token
PORT = 29420
ETCD = ["e0", "e1", "e2"]
CONTROLLERS = ["c0", "c1"]
NODES = ["h0", "h1", "h2"]
KEY = "/holdfast/ha-test/leader"


def etcd_available():
    try:
        subprocess.run(["etcd", "--version"], capture_output=True, check=True)
        return None
    except (OSError, subprocess.CalledProcessError):
        return "etcd is not installed (Debian's etcd-server; scripts/setup.sh)"


@pytest.fixture(scope="module")
def net():
    why = netns.available() or etcd_available()
    if why:
        pytest.skip(why)
    n = netns.TestNet([(h, "c") for h in ETCD + CONTROLLERS] +
                      [(h, "dc") for h in NODES])
    yield n
    n.close()


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory):
    """The final hash of the same trainer on 6 slots, on one machine."""
    out = tmp_path_factory.mktemp("ha-fault-free")
    r = subprocess.run(
        [str(BUILD / "holdfast-run"), "-n", str(WORLD), "--no-disk-tier",
         "--", *trainer(out)], capture_output=True, text=True, timeout=300,
        cwd=out)
    assert r.returncode == 0, r.stderr[-3000:]
    hashes = {m.group(4) for line in r.stdout.splitlines()
              if (m := FINAL.match(line))}
    assert len(hashes) == 1, r.stdout[-3000:]
    return hashes.pop()


class HaJob(Nodes):
    """etcd, two elected controllers and three nodes; with elected=False,
    one controller on c0 and no etcd (the baseline of
    benchmarks/failover_bench.py)."""

    def __init__(self, net, out, elected=True):
        super().__init__(net, out)
        self.procs = {}
        self.elected = elected
        (out / "token").write_text(TOKEN)
        if not elected:
            self.start_controller(CONTROLLERS[0])
            self.endpoint = f"{net.hosts[CONTROLLERS[0]].addr['c']}:{PORT}"
            return
        peers = ",".join(f"{h}=http://{net.hosts[h].addr['c']}:2380"
                         for h in ETCD)
        for h in ETCD:
            a = net.hosts[h].addr["c"]
            self._spawn(h, f"etcd-{h}", [
                "etcd", "--name", h, "--data-dir", str(out / f"etcd-{h}"),
                "--listen-client-urls", f"http://{a}:2379",
                "--advertise-client-urls", f"http://{a}:2379",
                "--listen-peer-urls", f"http://{a}:2380",
                "--initial-advertise-peer-urls", f"http://{a}:2380",
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"hf-{netns.RUN}"])
        for h in CONTROLLERS:
            self.start_controller(h)
            if h == CONTROLLERS[0]:
                self.wait_log(f"ctl-{h}", "leader at epoch")
        self.endpoint = ",".join(f"{net.hosts[h].addr['c']}:{PORT}"
                                 for h in CONTROLLERS)

    def _spawn(self, host, name, cmd):
        self.procs[name] = subprocess.Popen(
            self.net.hosts[host].exec_prefix() + cmd,
            stdout=subprocess.DEVNULL,
            stderr=open(self.out / f"{name}.log", "a"))

    def start_controller(self, host):
        a = self.net.hosts[host].addr["c"]
        elect = ["--etcd", self.etcd_list(), "--election-key", KEY] \
            if self.elected else []
        self._spawn(host, f"ctl-{host}", [
            str(BUILD / "holdfast-controller"), "--world-size", str(WORLD),
            "--bind", a, "--port", str(PORT), "--token-file",
            str(self.out / "token"), *elect])

    def etcd_leader(self):
        """The etcd host that leads etcd's own raft group now (its v3 JSON
        gateway's maintenance status, asked of each member)."""
        names = {}
        leader = None
        for h in ETCD:
            if self.procs[f"etcd-{h}"].poll() is not None:
                continue
            r = subprocess.run(
                self.net.hosts[h].exec_prefix() + [
                    "curl", "-s", "-m", "2", "-X", "POST", "-d", "{}",
                    f"http://{self.net.hosts[h].addr['c']}:2379"
                    "/v3/maintenance/status"],
                capture_output=True, text=True)
            if r.returncode != 0 or not r.stdout:
                continue
            st = json.loads(r.stdout)
            names[st["header"]["member_id"]] = h
            leader = st.get("leader", leader)
        assert leader in names, (leader, names)
        return names[leader]

    def etcd_list(self):
        return ",".join(f"{self.net.hosts[h].addr['c']}:2379" for h in ETCD)

    def wait_log(self, name, text, timeout=60):
        deadline = time.time() + timeout
        f = self.out / f"{name}.log"
        while time.time() < deadline:
            if f.exists() and text in f.read_text():
                return
            assert self.procs[name].poll() is None, f.read_text()
            time.sleep(0.05)
        raise AssertionError(f"{name}: no '{text}'\n{f.read_text()}")

    def command(self):
        return [str(BUILD / "holdfast-run"), "--nnodes", str(len(NODES)),
                "--nproc-per-node", str(PER_NODE), "--standby-per-node", "1",
                "--rdzv-endpoint", self.endpoint, "--rdzv-id", "ha-test",
                "--no-disk-tier", "--", *trainer(self.out)]

    def leader(self):
        """The controller host whose log says it leads now."""
        best, when = None, ""
        for h in CONTROLLERS:
            f = self.out / f"ctl-{h}.log"
            for line in f.read_text().splitlines() if f.exists() else []:
                if "leader at epoch" in line and line > when:
                    best, when = h, line
        return best

    def pause_after(self, t0):
        """The longest pause between steps begun after t0 - 1 s, and when
        it ended (seconds after t0)."""
        begun = []
        for f in self.out.glob("progress-*"):
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and int(parts[1]) / 1e9 > t0 - 1:
                    begun.append(int(parts[1]) / 1e9)
        begun.sort()
        gaps = [(b - a, b) for a, b in zip(begun, begun[1:])]
        longest, end = max(gaps) if gaps else (0.0, t0)
        return longest, end - t0

    def logs(self):
        parts = [super().logs()]
        for name in self.procs:
            f = self.out / f"{name}.log"
            text = f.read_text().splitlines() if f.exists() else []
            parts.append(f"--- {name}.log\n" + "\n".join(text[-15:]))
        return "\n".join(parts)

    def close(self):
        for h in CONTROLLERS + ETCD:
            self.net.hosts[h].set_link(True)
        super().close()
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def ha(net, tmp_path):
    made = []

    def make(elected=True):
        j = HaJob(net, tmp_path / f"ha{len(made)}", elected)
        made.append(j)
        return j

    yield make
    for j in made:
        j.close()


def run_to_end(j, want):
    rcs = j.wait(NODES)
    assert rcs == {h: 0 for h in NODES}, j.logs()
    finals = j.finals()
    assert sorted(finals) == list(range(WORLD)), (finals, j.logs())
    for slot, (node, step, world, h) in finals.items():
        assert (step, world, h) == (STEPS, WORLD, want), (slot, node, j.logs())
    # Nobody was fenced: the summaries list no incident.
    for h in NODES:
        err = (j.out / f"{h}.err").read_text()
        assert "#1 " not in err, err[-2000:]


def start_nodes(j):
    for h in NODES:
        j.start(h)
    j.wait_step(150)


def test_leader_killed(ha, fault_free):
    j = ha()
    start_nodes(j)
    old = j.leader()
    assert old == CONTROLLERS[0]
    killed_at = time.time()
    epoch = int(j.status().get("epoch", 0))
    assert epoch > 0
    j.procs[f"ctl-{old}"].send_signal(signal.SIGKILL)
    new = CONTROLLERS[1]
    j.wait_log(f"ctl-{new}", "leader at epoch")
    assert int(j.status().get("epoch", 0)) > epoch
    run_to_end(j, fault_free)
    pause, resumed = j.pause_after(killed_at)
    print(f"ha-case leader_killed: longest_pause_s={pause:.2f} "
          f"resumed_after_kill_s={resumed:.2f}")
    assert resumed < 30, resumed  # progress, not a speed claim


def test_leader_host_cut_off(ha, fault_free):
    j = ha()
    start_nodes(j)
    old = j.leader()
    cut_at = time.time()
    j.net.hosts[old].set_link(False)
    new = CONTROLLERS[1]
    j.wait_log(f"ctl-{new}", "leader at epoch")
    # The cut-off leader could not renew its lease: it stopped serving.
    j.wait_log(f"ctl-{old}", "lost the lead")
    run_to_end(j, fault_free)
    pause, resumed = j.pause_after(cut_at)
    print(f"ha-case leader_host_cut_off: longest_pause_s={pause:.2f} "
          f"resumed_after_cut_s={resumed:.2f}")


def test_one_etcd_member_lost(ha, fault_free):
    """etcd's own leader is killed: etcd elects another (its election
    timeout is 1 s, randomised up to 2 s), and the controller's lease
    renewals wait that out within the lease."""
    j = ha()
    start_nodes(j)
    leader = j.leader()
    lost = j.etcd_leader()
    j.procs[f"etcd-{lost}"].send_signal(signal.SIGKILL)
    run_to_end(j, fault_free)
    # The leader kept its lead through it.
    assert j.leader() == leader
    assert "lost the lead" not in (j.out / f"ctl-{leader}.log").read_text()


def test_lone_controller_restarted_keeps_committing(ha, fault_free):
    """Without etcd: one controller, killed and restarted at once on its
    host. Members resume with it, and checkpoints go on committing: an ack
    the old controller took to its grave is sent again."""
    j = ha(elected=False)
    start_nodes(j)
    before = int(j.status().get("committed_step", -1))
    j.procs[f"ctl-{CONTROLLERS[0]}"].send_signal(signal.SIGKILL)
    j.procs[f"ctl-{CONTROLLERS[0]}"].wait()
    j.start_controller(CONTROLLERS[0])
    deadline = time.time() + 30
    while True:
        try:
            now = int(j.status().get("committed_step", -1))
        except RuntimeError:
            now = -1
        if now > before:
            break
        assert time.time() < deadline, f"no commit after {before}\n{j.logs()}"
        time.sleep(0.05)
    run_to_end(j, fault_free)
