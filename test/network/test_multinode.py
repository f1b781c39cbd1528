"""Many nodes, launched the way users launch them (docs/multi-node.md).

Test hosts h0..h3 (test/network/netns.py) each run the same holdfast-run
command: --nnodes 3:4 --nproc-per-node 2 --standby-per-node 1, with the
rendezvous endpoint on h0's control address, so h0's holdfast-run serves
the controller and every node's holdfast-run starts the node's host agent,
its standby and its 2 workers. What differs per host comes from the
environment, as on a cluster: the node's name (HOLDFAST_HOST, or Slurm's
SLURMD_NODENAME) and its data address (HOLDFAST_BIND_ADDR).

The trainer is holdfast-dp-trainer, whose final hash is the same whatever
the faults in replace mode while the world keeps its size; every case
ends with the fault-free hash on all 6 slots but the last, where the
world shrinks and grows back (the same hash on all 6 slots).
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
import netns  # noqa: E402
from jobs import controller_status  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("HOLDFAST_BUILD_DIR", ROOT / "build")).resolve()
TOKEN = "multinode-test-token"
PORT = 29410
HOSTS = ["h0", "h1", "h2", "h3"]
NODES = 3
PER_NODE = 2
WORLD = NODES * PER_NODE
STEPS = 900
STEP_MS = 10
FINAL = re.compile(r"^\[slot (\d+)\] final step=(\d+) world=(\d+) "
                   r"params_sha256=([0-9a-f]+)$")


@pytest.fixture(scope="module")
def net():
    why = netns.available()
    if why:
        pytest.skip(why)
    n = netns.TestNet([(h, "dc") for h in HOSTS])
    yield n
    n.close()


def trainer(out):
    return [str(BUILD / "holdfast-dp-trainer"), "--steps", str(STEPS),
            "--step-ms", str(STEP_MS), "--progress-dir", str(out)]


class Nodes:
    """One job: a holdfast-run per node, started by `start(host)`."""

    def __init__(self, net, out):
        self.net, self.out = net, out
        out.mkdir(parents=True, exist_ok=True)
        self.endpoint = f"{net.hosts['h0'].addr['c']}:{PORT}"
        self.launchers = {}

    def env(self, host, **extra):
        h = self.net.hosts[host]
        env = dict(os.environ, HOLDFAST_HOST=host,
                   HOLDFAST_BIND_ADDR=h.addr["d"], HOLDFAST_JOB_TOKEN=TOKEN,
                   PATH=f"{BUILD}:{os.environ.get('PATH', '')}")
        for k in ("HOLDFAST_CHECKPOINT_DIR", "HOLDFAST_RDZV_ENDPOINT",
                  "SLURM_JOB_ID"):
            env.pop(k, None)
        env.update(extra)
        return env

    def command(self, standbys=1):
        """The command every node runs: the same on each."""
        return [str(BUILD / "holdfast-run"), "--nnodes", f"{NODES}:4",
                "--nproc-per-node", str(PER_NODE), "--standby-per-node",
                str(standbys),
                "--rdzv-endpoint", self.endpoint, "--rdzv-id", "mn-test",
                # The test nodes share one kernel: h0's controller would see
                # the other "nodes'" processes exit in /proc, which it
                # cannot on machines of their own.
                "--exit-watch-ms", "0",
                "--no-disk-tier", "--", *trainer(self.out)]

    def start(self, host, cmd=None, env=None, name=None):
        name = name or host
        self.launchers[name] = subprocess.Popen(
            self.net.hosts[host].exec_prefix() + (cmd or self.command()),
            env=env or self.env(host), cwd=self.out,
            stdout=open(self.out / f"{name}.out", "w"),
            stderr=open(self.out / f"{name}.err", "w"))

    def status(self):
        return controller_status(BUILD, self.endpoint, TOKEN)

    def step(self):
        """The highest step any worker has begun."""
        best = 0
        for f in self.out.glob("progress-*"):
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2:
                    best = max(best, int(parts[0]))
        return best

    def wait_step(self, step, timeout=120):
        deadline = time.time() + timeout
        while self.step() < step:
            for name, p in self.launchers.items():
                assert p.poll() is None, f"{name} ended early\n{self.logs()}"
            assert time.time() < deadline, f"no step {step}\n{self.logs()}"
            time.sleep(0.05)

    def wait_members(self, host, count, timeout=60):
        """Waits until `count` members of `host` are alive in the job."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                st = self.status()
            except RuntimeError:
                st = {}
            alive = [m for m in st.get("members", [])
                     if m.get("host") == host and m.get("state") == "STATE_ALIVE"]
            if len(alive) >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"{host} did not join\n{self.logs()}")

    def kill_node(self, host):
        """Every process on `host`, at once: a node lost whole."""
        ns = self.net.hosts[host].ns
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                              text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def wait(self, names, timeout=180):
        rcs = {}
        for name in names:
            try:
                rcs[name] = self.launchers[name].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{name} did not end\n{self.logs()}")
        return rcs

    def finals(self):
        """slot -> (node, step, world, hash) of the slot's final line."""
        found = {}
        for name in self.launchers:
            f = self.out / f"{name}.out"
            for line in f.read_text().splitlines() if f.exists() else []:
                m = FINAL.match(line)
                if m:
                    found[int(m.group(1))] = (name, int(m.group(2)),
                                              int(m.group(3)), m.group(4))
        return found

    def logs(self):
        parts = []
        for name in self.launchers:
            f = self.out / f"{name}.err"
            text = f.read_text().splitlines() if f.exists() else []
            parts.append(f"--- {name}.err\n" + "\n".join(text[-60:]))
        return "\n".join(parts)

    def close(self):
        for name, p in self.launchers.items():
            if p.poll() is None:
                p.kill()
        for host in self.net.hosts:
            self.kill_node(host)
        for p in self.launchers.values():
            p.wait()


@pytest.fixture
def nodes(net, tmp_path):
    made = []

    def make():
        j = Nodes(net, tmp_path / f"job{len(made)}")
        made.append(j)
        return j

    yield make
    for j in made:
        j.close()


def assert_fault_free_end(j, want, lost=()):
    finals = j.finals()
    assert sorted(finals) == list(range(WORLD)), (finals, j.logs())
    for slot, (node, step, world, h) in finals.items():
        assert (step, world, h) == (STEPS, WORLD, want), (slot, node, j.logs())
        assert node not in lost, (slot, node)
    return finals


@pytest.fixture(scope="module")
def fault_free(net, tmp_path_factory):
    j = Nodes(net, tmp_path_factory.mktemp("fault-free"))
    try:
        for host in HOSTS[:NODES]:
            j.start(host)
        rcs = j.wait(HOSTS[:NODES])
        assert rcs == {h: 0 for h in HOSTS[:NODES]}, j.logs()
        finals = j.finals()
        assert sorted(finals) == list(range(WORLD)), (finals, j.logs())
        hashes = {f[3] for f in finals.values()}
        assert len(hashes) == 1 and all(f[1] == STEPS
                                        for f in finals.values())
        # Node h0 served the controller; each node ran its 2 workers.
        assert "(served here)" in (j.out / "h0.err").read_text()
        for host in HOSTS[1:NODES]:
            assert "(served here)" not in (j.out / f"{host}.err").read_text()
        per_node = {h: sum(1 for f in finals.values() if f[0] == h)
                    for h in HOSTS[:NODES]}
        assert per_node == {h: PER_NODE for h in HOSTS[:NODES]}, per_node
        return hashes.pop()
    finally:
        j.close()


def test_fault_free(fault_free):
    assert len(fault_free) == 64


def slurm_line():
    """The line the example batch script runs on each node, after srun."""
    text = (ROOT / "examples/slurm/holdfast.sbatch").read_text()
    text = text.replace("\\\n", " ")
    line = next(l for l in text.splitlines() if l.startswith("srun "))
    return line[line.index("holdfast-run"):]


def test_slurm_batch_script_line(nodes, fault_free):
    """The example batch script's srun line, run on each test host with
    the variables Slurm sets there (one task per node)."""
    j = nodes()
    line = slurm_line()
    assert line.startswith("holdfast-run --nproc-per-node"), line
    for i, host in enumerate(HOSTS[:NODES]):
        env = j.env(host, SLURM_JOB_ID="4242", SLURM_NNODES=str(NODES),
                    SLURM_NODEID=str(i), SLURM_NTASKS=str(NODES),
                    SLURMD_NODENAME=host, SLURM_JOB_NODELIST="h[0-2]",
                    HOLDFAST_RDZV_ENDPOINT=j.endpoint,
                    NPROC_PER_NODE=str(PER_NODE), STANDBY_PER_NODE="1")
        env.pop("HOLDFAST_HOST")
        j.start(host, ["bash", "-c", line, "sbatch", *trainer(j.out)], env)
    rcs = j.wait(HOSTS[:NODES])
    assert rcs == {h: 0 for h in HOSTS[:NODES]}, j.logs()
    finals = assert_fault_free_end(j, fault_free)
    # Slurm's node ids chose the slots: node i works slots 2i and 2i+1.
    for slot, (node, *_rest) in finals.items():
        assert node == HOSTS[slot // PER_NODE], (slot, node)
    err = (j.out / "h1.err").read_text()
    assert "from SLURM_NNODES, SLURM_NODEID, SLURM_JOB_ID, SLURMD_NODENAME" \
        in err, err


def test_node_killed(nodes, fault_free):
    j = nodes()
    for host in HOSTS[:NODES]:
        j.start(host)
    j.wait_step(150)
    killed_at = time.time()
    assert j.kill_node("h2") >= 4  # its launcher, standby and 2 workers
    rcs = j.wait(["h0", "h1"])
    assert rcs == {"h0": 0, "h1": 0}, j.logs()
    assert_fault_free_end(j, fault_free, lost=("h2",))
    summary = (j.out / "h0.err").read_text()
    assert "host agent's stream ended (host h2)" in summary, summary
    print(f"multinode-case node_killed: wall_after_kill_s="
          f"{time.time() - killed_at:.1f}")


def test_node_added_while_the_job_runs(nodes, fault_free):
    """A fourth node joins a running job as spare capacity (all its
    processes standbys); then two nodes are lost at once, and the new
    node's standbys take three of the four lost slots (h0 has one)."""
    j = nodes()
    for host in HOSTS[:NODES]:
        j.start(host)
    j.wait_step(100)
    j.start("h3")
    j.wait_members("h3", PER_NODE + 1)
    # A node with a name already in the job, and a fifth node, are refused.
    j.start("h3", env=j.env("h3", HOLDFAST_HOST="h1"), name="dup")
    j.start("h3", env=j.env("h3", HOLDFAST_HOST="h4"), name="fifth")
    rcs = j.wait(["dup", "fifth"], timeout=60)
    assert rcs == {"dup": 1, "fifth": 1}, j.logs()
    assert "a node named 'h1' is in the job already" in \
        (j.out / "dup.err").read_text()
    assert "the job has its most nodes already (--nnodes 3:4, 4 live)" in \
        (j.out / "fifth.err").read_text()
    del j.launchers["dup"], j.launchers["fifth"]
    j.kill_node("h1")
    j.kill_node("h2")
    rcs = j.wait(["h0", "h3"])
    assert rcs == {"h0": 0, "h3": 0}, j.logs()
    finals = assert_fault_free_end(j, fault_free, lost=("h1", "h2"))
    from_new = sorted(s for s, f in finals.items() if f[0] == "h3")
    assert len(from_new) == 3, finals


def test_world_grows_back_when_a_node_joins(nodes):
    """Without standbys a lost node shrinks the world from 6 to 4 slots; a
    node added later (2 standbys: nproc-per-node on a spare node) grows it
    back to 6 (--max-world defaults to the start's world in replace mode).
    The steps done in the smaller world sum in another order, so the end
    is not the fault-free hash, but every slot ends with the same one
    (replicated state put back into the larger world)."""
    j = nodes()
    cmd = j.command(standbys=0)
    for host in HOSTS[:NODES]:
        j.start(host, cmd)
    j.wait_step(150)
    j.kill_node("h2")
    deadline = time.time() + 60
    while j.status().get("world_size") != WORLD - PER_NODE:
        assert time.time() < deadline, f"no shrink\n{j.logs()}"
        time.sleep(0.1)
    j.start("h3", cmd)
    rcs = j.wait(["h0", "h1", "h3"])
    assert rcs == {"h0": 0, "h1": 0, "h3": 0}, j.logs()
    finals = j.finals()
    assert sorted(finals) == list(range(WORLD)), (finals, j.logs())
    assert len({f[3] for f in finals.values()}) == 1, finals
    for slot, (node, step, world, _) in finals.items():
        assert (step, world) == (STEPS, WORLD), (slot, node, j.logs())
    assert sorted(s for s, f in finals.items() if f[0] == "h3") == [4, 5]
    served = (j.out / "h0.err").read_text()
    assert "the world grows from 4 to 6 workers (2 standbys waited" in \
        served, served

