"""Faults in the network, on test hosts (test/network/netns.py).

Three worker hosts h0, h1 (topology block rackA) and h2 (rackB), with 2
workers and 1 standby each, and the controller on a host of its own
(ctl). Each host's processes are started by that host's own launcher
(host_launcher.sh) and join the controller through HOLDFAST_CONTROLLER:
its address, or with `agents` the Unix socket of a host agent
(holdfast-agent) that runs on the host and reaches the controller over
its control link.
The trainer is holdfast-dp-trainer, whose final hash is the same whatever
the faults in replace mode. Each test asserts on the final hashes, on the
incident records (who was declared what, after how long) and on when the
cut-off members last began a step.

The controller runs with its defaults (grace = --silent-after-ms, lease =
--lease-ms; docs/configuration.md) unless a test says otherwise.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
import netns  # noqa: E402
from jobs import LaunchedProcesses, controller_status  # noqa: E402

BUILD = pathlib.Path(os.environ.get(
    "HOLDFAST_BUILD_DIR",
    pathlib.Path(__file__).resolve().parents[2] / "build"))
HERE = pathlib.Path(__file__).resolve().parent
TOKEN = "network-test-token"
PORT = 29400
WORKER_HOSTS = ["h0", "h1", "h2"]
BLOCKS = {"h0": "rackA", "h1": "rackA", "h2": "rackB"}
PER_HOST = 2
WORLD = PER_HOST * len(WORKER_HOSTS)
# The controller's defaults (src/control/membership.h), which these tests
# check: a member unheard for GRACE is lost; one that has not heard from
# the controller for LEASE stops acting.
GRACE_S = 3.0
LEASE_S = 2.0
STEP_MS = 10
STEPS = 900


@pytest.fixture(scope="module")
def net():
    why = netns.available()
    if why:
        pytest.skip(why)
    n = netns.TestNet([("ctl", "c")] + [(h, "dc") for h in WORKER_HOSTS])
    yield n
    n.close()


class Job(LaunchedProcesses):
    """One job on the test hosts: the controller on ctl, and each worker
    host's launcher."""

    def __init__(self, net, out, controller_args=(), steps=STEPS, standbys=1,
                 agents=False):
        self.net, self.out = net, out
        out.mkdir(parents=True, exist_ok=True)
        (out / "token").write_text(TOKEN)
        ctl = net.hosts["ctl"]
        self.address = f"{ctl.addr['c']}:{PORT}"
        self.controller = subprocess.Popen(
            ctl.exec_prefix() + [
                str(BUILD / "holdfast-controller"), "--world-size", str(WORLD),
                "--bind", ctl.addr["c"], "--port", str(PORT), "--token-file",
                str(out / "token"),
                # The test hosts share one kernel: the controller would see
                # the other "machines'" processes exit in /proc, which a
                # controller on a machine of its own cannot.
                "--exit-watch-ms", "0", *controller_args],
            stdout=subprocess.DEVNULL,
            stderr=open(out / "controller.log", "w"))
        self._wait_status()
        self.agents = {}
        if agents:
            for name in WORKER_HOSTS:
                self._start_agent(name)
        self.launchers = {}
        for i, name in enumerate(WORKER_HOSTS):
            h = net.hosts[name]
            env = dict(os.environ,
                       HOLDFAST_CONTROLLER=(self._agent_socket(name) if agents
                                            else self.address),
                       HOLDFAST_JOB_TOKEN=TOKEN, HOLDFAST_BIND_ADDR=h.addr["d"],
                       HOLDFAST_TOPOLOGY_BLOCK=BLOCKS[name],
                       HOLDFAST_TRACE_DIR=str(out / "trace"),
                       HOLDFAST_LOG_LEVEL="info")
            env.pop("HOLDFAST_CHECKPOINT_DIR", None)
            self.launchers[name] = subprocess.Popen(
                h.exec_prefix() + [
                    str(HERE / "host_launcher.sh"), str(out), name,
                    str(i * PER_HOST), str(PER_HOST), str(standbys), "--",
                    str(BUILD / "holdfast-dp-trainer"), "--steps", str(steps),
                    "--step-ms", str(STEP_MS), "--progress-dir", str(out)],
                env=env)

    def _agent_socket(self, host):
        return f"unix:{self.out / ('agent-' + host + '.sock')}"

    def _start_agent(self, host):
        addr = self.out / f"agent-{host}.address"
        self.agents[host] = subprocess.Popen(
            self.net.hosts[host].exec_prefix() + [
                str(BUILD / "holdfast-agent"), "--controller", self.address,
                "--listen", self._agent_socket(host), "--token-file",
                str(self.out / "token"), "--host", host, "--address-file",
                str(addr)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.out / f"agent-{host}.log", "w"))
        deadline = time.time() + 30
        while not (addr.exists() and addr.read_text().strip()):
            assert self.agents[host].poll() is None, "an agent exited"
            assert time.time() < deadline, f"{host}'s agent did not start"
            time.sleep(0.05)

    def _wait_status(self, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.controller.poll() is None, "the controller exited"
            try:
                return self.status()
            except RuntimeError:
                time.sleep(0.1)
        raise AssertionError("the controller did not answer")

    def status(self):
        return controller_status(BUILD, self.address, TOKEN)

    def names(self):
        """pid -> process name (h1-w0, h2-s0, ...)."""
        found = {}
        for f in self.out.glob("*.pid"):
            text = f.read_text().strip()
            if text.isdigit():  # else still being written
                found[int(text)] = f.stem
        return found

    def progress(self):
        """process name -> [(step, unix s)] of the steps it began."""
        names = self.names()
        found = {}
        for f in self.out.glob("progress-*"):
            pid = int(f.name.split("-")[1])
            events = []
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2:
                    events.append((int(parts[0]), int(parts[1]) / 1e9))
            found[names.get(pid, str(pid))] = events
        return found

    def wait_step(self, step, timeout=120):
        """Waits until every worker has begun `step`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            p = self.progress()
            workers = [p.get(f"{h}-w{i}", []) for h in WORKER_HOSTS
                       for i in range(PER_HOST)]
            if all(e and max(s for s, _ in e) >= step for e in workers):
                return
            self.check_running()
            time.sleep(0.05)
        raise AssertionError(f"the job did not reach step {step}")

    def check_running(self):
        for name, p in self.launchers.items():
            if p.poll() is not None:
                raise AssertionError(
                    f"{name}'s launcher ended early\n{self.logs()}")

    def host_pids(self, host):
        return [pid for pid, name in self.names().items()
                if name.startswith(host + "-")]

    def wait_end(self, hosts=WORKER_HOSTS, timeout=240):
        super().wait_end(hosts, timeout)

    def logs(self):
        return self.log_tails(sorted(self.out.glob("*.err")) +
                              sorted(self.out.glob("agent-*.log")) +
                              [self.out / "controller.log"], 15)

    def close(self):
        for name in WORKER_HOSTS:
            self.net.hosts[name].set_link(True)
            self.net.hosts[name].block([])
        self.net.hosts["ctl"].set_link(True)
        for pid in self.names():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in [*self.launchers.values(), *self.agents.values(),
                  self.controller]:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def job(net, tmp_path):
    jobs = []

    def make(**kw):
        j = Job(net, tmp_path / f"job{len(jobs)}", **kw)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.close()


@pytest.fixture(scope="module")
def fault_free(net, tmp_path_factory):
    """The final hash of the job with no fault (every worker agrees)."""
    j = Job(net, tmp_path_factory.mktemp("fault-free"))
    try:
        j.wait_end()
        finals = j.finals()
        workers = {n: f for n, f in finals.items() if "-w" in n}
        assert len(workers) == WORLD, j.logs()
        hashes = {f[2] for f in workers.values()}
        assert len(hashes) == 1 and all(f[0] == STEPS for f in workers.values())
        st = j.status()
        assert not st.get("incidents"), st.get("incidents")
        return hashes.pop()
    finally:
        j.close()


def incidents(st):
    return st.get("incidents", [])


def assert_finished_equal(j, want, lost_hosts=()):
    """Every slot's final holder finished STEPS with the fault-free hash;
    processes of the lost hosts did not finish."""
    finals = j.finals()
    done = {n: f for n, f in finals.items()}
    assert len(done) == WORLD, (done, j.logs())
    for n, f in done.items():
        assert f == (STEPS, WORLD, want), (n, f, j.logs())
        assert not any(n.startswith(h + "-") for h in lost_hosts), n


def last_begun(j, host):
    """The time the last step was begun by a process of `host`."""
    times = [t for n, e in j.progress().items() if n.startswith(host + "-")
             for _, t in e]
    return max(times) if times else 0.0


def report(j, case, cut_at, host=None):
    """Prints one line for the closing note (pytest -s): the time from the
    fault to its detection (the first incident), the time from the fault
    to the end of the longest pause in training after it (the first step
    begun after that pause), and how many members of other hosts were
    evicted."""
    st = j.status()
    found = incidents(st)
    detect = min((int(i["detected_unix_ms"]) / 1000 for i in found),
                 default=None)
    begun = sorted(t for n, e in j.progress().items()
                   if host is None or not n.startswith(host + "-")
                   for _, t in e if t > cut_at - 1)
    gaps = [(b - a, b) for a, b in zip(begun, begun[1:])]
    longest, resumed = max(gaps) if gaps else (0.0, cut_at)
    evicted = [i for i in found if i.get("evicted") and i.get("host") != host]
    print(f"network-case {case}: detect_s="
          f"{'-' if detect is None else round(detect - cut_at, 2)} "
          f"longest_pause_s={longest:.2f} recovered_s="
          f"{max(0.0, resumed - cut_at):.2f} healthy_evicted={len(evicted)} "
          f"generation={int(st.get('generation', 0))} "
          f"evicted={sum(1 for i in found if i.get('evicted'))}")


def test_fault_free(fault_free):
    assert len(fault_free) == 64


@pytest.mark.parametrize("blip_s", [0.2, 1.0])
def test_blip_shorter_than_grace_costs_nothing(job, fault_free, blip_s):
    j = job()
    j.wait_step(100)
    gen = int(j.status().get("generation", 0))
    j.net.hosts["h1"].set_link(False)
    cut_at = time.time()
    time.sleep(blip_s)
    j.net.hosts["h1"].set_link(True)
    j.wait_end()
    report(j, f"blip {blip_s} s", cut_at)
    st = j.status()
    assert incidents(st) == [], (incidents(st), j.logs())
    assert int(st.get("generation", 0)) == gen
    assert_finished_equal(j, fault_free)
    # No standby was used, and nobody was fenced.
    for n in j.all_names():
        assert j.rc(n) == 0, (n, j.rc(n), j.logs())
        if "-s" in n:
            assert j.final(n) is None, n


def declared(st, host):
    """The incidents about the members of `host`, and about the others."""
    mine = [i for i in incidents(st) if i.get("host") == host]
    others = [i for i in incidents(st) if i.get("host") != host]
    return mine, others


def assert_host_lost(j, st, host, cut_at, kinds=("INCIDENT_SILENT",)):
    """`host`'s two workers (and its standby) were declared lost, within
    the grace and the detection time; nobody else was; its slots went to
    standbys of other hosts, one of its own block first."""
    mine, others = declared(st, host)
    assert others == [], (others, j.logs())
    workers = [i for i in mine if i.get("slot", 0) >= 0]
    assert len(workers) == PER_HOST, json.dumps(mine, indent=1)
    for i in workers:
        assert i["kind"] in kinds, i
        assert i.get("evicted"), i
        detected = int(i["detected_unix_ms"]) / 1000
        # Silence is counted from the last heartbeat, which came before
        # the cut; the bound adds the heartbeat interval, the scan and
        # this VM's scheduling.
        assert detected - cut_at >= GRACE_S - 0.6, (i, cut_at)
        assert detected - cut_at <= GRACE_S + 2.5, (i, cut_at)
    # (JSON leaves out a slot 0.)
    holders = {m.get("slot", 0): m for m in st["members"]
               if m.get("role") == "ROLE_WORKER"
               and m.get("state") in ("STATE_ALIVE", "STATE_LEFT")}
    lost_slots = {i.get("slot", 0) for i in workers}
    assert lost_slots <= set(holders), (lost_slots, holders)
    new_hosts = sorted(holders[s]["host"] for s in lost_slots if s in holders)
    assert host not in new_hosts
    return workers


def test_blip_longer_than_grace_loses_the_host(job, fault_free):
    j = job()
    j.wait_step(100)
    j.net.hosts["h1"].set_link(False)
    cut_at = time.time()
    time.sleep(5.0)
    j.net.hosts["h1"].set_link(True)
    j.wait_end()
    report(j, "blip 5 s", cut_at, "h1")
    st = j.status()
    assert_host_lost(j, st, "h1", cut_at)
    assert_finished_equal(j, fault_free, lost_hosts=["h1"])
    # h1's members heard they were fenced once the link came back.
    for n in ("h1-w0", "h1-w1"):
        assert j.rc(n) == 3, (n, j.rc(n), j.logs())
    # h0's standby (rackA, as h1) took one of the slots.
    assert j.final("h0-s0") is not None


def test_host_cut_for_good(job, fault_free):
    j = job()
    j.wait_step(100)
    j.net.hosts["h2"].set_link(False)
    cut_at = time.time()
    committed_at_cut = int(j.status().get("committed_step", 0))
    j.wait_end(hosts=["h0", "h1"])
    report(j, "host cut for good", cut_at, "h2")
    st = j.status()
    assert_host_lost(j, st, "h2", cut_at)
    assert_finished_equal(j, fault_free, lost_hosts=["h2"])
    # The cut-off members stopped acting within the lease: no step begun
    # after it (a step under way at the cut may begin its successor).
    assert last_begun(j, "h2") <= cut_at + LEASE_S + 0.5
    # Back on the network, they learn they were fenced and exit, knowing
    # no commit newer than the controller had when they were cut off.
    j.net.hosts["h2"].set_link(True)
    j.wait_end(hosts=["h2"], timeout=60)
    for n in ("h2-w0", "h2-w1"):
        assert j.rc(n) == 3, (n, j.rc(n), j.logs())
        err = (j.out / f"{n}.err").read_text()
        assert "fenced" in err, err[-2000:]
        known = int(err.split("dp-trainer: committed=")[1].split()[0])
        assert 0 <= known <= committed_at_cut, (n, known, committed_at_cut)


def test_agent_stopped_member_is_found_in_a_second(job, fault_free):
    """Behind host agents: a SIGSTOPped member's local stream goes quiet
    while its agent is heard, and the controller declares it silent well
    within the grace that the blip and cut cases below keep."""
    j = job(agents=True)
    j.wait_step(100)
    victim = next(p for p, n in j.names().items() if n == "h1-w0")
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.time()
    deadline = stopped_at + 10
    while time.time() < deadline and not incidents(j.status()):
        time.sleep(0.1)
    os.kill(victim, signal.SIGCONT)  # it learns it was fenced, and exits
    j.wait_end()
    report(j, "agents: member SIGSTOP", stopped_at, "h1")
    st = j.status()
    found = incidents(st)
    assert len(found) == 1, (found, j.logs())
    inc = found[0]
    assert inc["kind"] == "INCIDENT_SILENT" and inc["host"] == "h1", inc
    assert "host agent on h1 heard nothing from it" in inc["evidence"], inc
    assert int(inc["detected_unix_ms"]) / 1000 - stopped_at < 1.0, inc
    assert j.rc("h1-w0") == 3, (j.rc("h1-w0"), j.logs())
    finals = j.finals()
    assert "h1-w0" not in finals and len(finals) == WORLD, (finals, j.logs())
    for n, f in finals.items():
        assert f == (STEPS, WORLD, fault_free), (n, f, j.logs())


def test_agent_host_blip_costs_nothing(job, fault_free):
    """Behind host agents, a 1 s cut of a host's links silences its agent's
    stream, never a member's local one: nobody is declared."""
    j = job(agents=True)
    j.wait_step(100)
    j.net.hosts["h1"].set_link(False)
    cut_at = time.time()
    time.sleep(1.0)
    j.net.hosts["h1"].set_link(True)
    j.wait_end()
    report(j, "agents: blip 1.0 s", cut_at)
    st = j.status()
    assert incidents(st) == [], (incidents(st), j.logs())
    assert_finished_equal(j, fault_free)


def test_agent_host_cut_keeps_the_grace(job, fault_free):
    """Behind host agents, a host cut off for good is found by the silence
    rule after the grace, as without agents: its members' local streams
    stay up, so the agent reports no quiet member."""
    j = job(agents=True)
    j.wait_step(100)
    j.net.hosts["h2"].set_link(False)
    cut_at = time.time()
    j.wait_end(hosts=["h0", "h1"])
    report(j, "agents: host cut for good", cut_at, "h2")
    st = j.status()
    workers = assert_host_lost(j, st, "h2", cut_at)
    for i in workers:
        assert "no heartbeat for" in i["evidence"], i
    assert_finished_equal(j, fault_free, lost_hosts=["h2"])


def test_data_link_cut_for_good(job, fault_free):
    """h1 loses its data network for good and keeps its control link: the
    controller still hears every member. The ops that talk to h1 fail
    (TCP_USER_TIMEOUT), the rendezvous' connects to and from h1 fail, and
    the members say whom they could not reach: members on h0 and h2 lost
    h1, so h1 is cut off, its workers are fenced, and standbys of h0 and
    h2 (not h1's) take their slots. The job ends with the fault-free hash,
    nobody on h0 or h2 is evicted, and it never loops."""
    j = job()
    j.wait_step(100)
    j.net.hosts["h1"].set_link(False, nets=("d",))
    cut_at = time.time()
    j.wait_end(hosts=["h0", "h2"], timeout=180)
    report(j, "data link cut for good", cut_at, "h1")
    st = j.status()
    assert_host_unreachable(j, st, "h1", "host cut off", fault_free)
    # Generations: a few rebuilds, then the fences; never a loop.
    assert int(st.get("generation", 0)) <= 10, st.get("generation")
    # h1's workers hear over the control network that they were fenced.
    j.wait_end(hosts=["h1"], timeout=60)
    for n in ("h1-w0", "h1-w1"):
        assert j.rc(n) == 3, (n, j.rc(n), j.logs())


def assert_host_unreachable(j, st, host, rule, want):
    """`host`'s workers, and nobody else, were fenced as unreachable by
    `rule`; its standby took no slot; every slot finished with the
    fault-free hash `want`."""
    assert_only_evicted(st, [host], j)
    fenced = [i for i in incidents(st) if i.get("evicted")]
    assert len(fenced) == PER_HOST, json.dumps(incidents(st), indent=1)
    for i in fenced:
        assert i["kind"] == "INCIDENT_UNREACHABLE", i
        assert rule in i["evidence"], i
    assert_finished_equal(j, want, lost_hosts=[host])
    assert j.final(f"{host}-s0") is None, f"{host}'s standby took a slot"


def assert_only_evicted(st, hosts, j):
    """Every member evicted was on one of `hosts`, for the data network."""
    for i in incidents(st):
        if i.get("evicted"):
            assert i.get("host") in hosts, json.dumps(incidents(st), indent=1)


def test_data_link_flapping(job, fault_free):
    """h1's data link goes down for 2 s and up for 2 s, for 20 s. The job
    never loops, ends with the fault-free hash, and evicts nobody but h1's
    members; h1's link is reported as flapping (its workers as stragglers)."""
    j = job()
    j.wait_step(100)
    cut_at = time.time()
    for _ in range(5):
        j.net.hosts["h1"].set_link(False, nets=("d",))
        time.sleep(2.0)
        j.net.hosts["h1"].set_link(True, nets=("d",))
        time.sleep(2.0)
    j.wait_end(hosts=["h0", "h2"], timeout=180)
    report(j, "data link flapping", cut_at, "h1")
    st = j.status()
    assert_only_evicted(st, ["h1"], j)
    flaps = [i for i in incidents(st) if i["kind"] == "INCIDENT_STRAGGLER"]
    assert flaps and all(
        i["host"] == "h1" and "data link of its host h1 flaps" in i["evidence"]
        for i in flaps), json.dumps(incidents(st), indent=1)
    assert_finished_equal(j, fault_free, lost_hosts=[])
    assert int(st.get("generation", 0)) <= 20, st.get("generation")


def test_one_pair_blocked(job, fault_free):
    """Packets between h0 and h2 are dropped (nftables), every other pair
    is fine: the verdict names the link, and one side's members (h2's, the
    later name of two equal sides) are evicted, nobody on h1. The job ends
    with the fault-free hash."""
    j = job()
    j.wait_step(100)
    j.net.hosts["h0"].block([j.net.hosts["h2"].addr["d"]])
    cut_at = time.time()
    try:
        j.wait_end(hosts=["h0", "h1"], timeout=180)
    finally:
        j.net.hosts["h0"].block([])
    report(j, "one pair blocked", cut_at, "h2")
    st = j.status()
    assert_host_unreachable(j, st, "h2", "link", fault_free)


def assert_lossy_host_named(st, evicted):
    """The straggler incidents name h1's two workers alone, by its link;
    `evicted` says whether they were replaced. The loss may also reset a
    connection (data unacknowledged for HOLDFAST_TCP_USER_TIMEOUT_MS): the
    group is then rebuilt, and that incident evicts nobody."""
    found = incidents(st)
    text = json.dumps(found, indent=1)
    stragglers = [i for i in found if i["kind"] == "INCIDENT_STRAGGLER"]
    assert {i["host"] for i in stragglers} == {"h1"}, text
    # (JSON leaves out a slot 0; h1's workers hold slots 2 and 3.)
    assert {i.get("slot", 0) for i in stragglers} == {2, 3}, text
    assert all("data link of its host h1 loses packets" in i["evidence"]
               for i in stragglers), text
    assert all(bool(i.get("evicted")) == evicted for i in stragglers), text
    others = [i for i in found if i["kind"] != "INCIDENT_STRAGGLER"]
    assert all(i["kind"] == "INCIDENT_COMM_FAILED" and not i.get("evicted")
               for i in others), text


def test_lossy_data_link_names_its_host(job, fault_free):
    """h1's data link drops 5 % of its packets, both ways, from step 100
    to the end (nftables' numgen; the control network is clean). Every
    training connection that crosses it retransmits, those between h0 and
    h2 do not: h1's two workers are reported as stragglers, with the
    host's link as the evidence, nobody else is named, nobody is evicted,
    and the job ends with the fault-free hash."""
    j = job()
    j.wait_step(100)
    j.net.hosts["h1"].lossy(5)
    cut_at = time.time()
    try:
        j.wait_end(timeout=240)
    finally:
        j.net.hosts["h1"].lossy(0)
    report(j, "lossy data link", cut_at, "h1")
    assert_lossy_host_named(j.status(), evicted=False)
    assert_finished_equal(j, fault_free)


def test_lossy_data_link_replaced_under_the_straggler_policy(job, fault_free):
    """The same loss with --stragglers replace: h1's two workers are
    replaced by the standbys of h0 and h2 (never h1's own), and the job
    ends with the fault-free hash."""
    j = job(controller_args=["--stragglers", "replace"])
    j.wait_step(100)
    j.net.hosts["h1"].lossy(5)
    cut_at = time.time()
    try:
        j.wait_end(hosts=["h0", "h2"], timeout=240)
    finally:
        j.net.hosts["h1"].lossy(0)
    report(j, "lossy data link, replace", cut_at, "h1")
    st = j.status()
    assert_lossy_host_named(st, evicted=True)
    # (JSON leaves out a slot 0.)
    holders = {m.get("slot", 0): m for m in st["members"]
               if m.get("role") == "ROLE_WORKER"
               and m.get("state") in ("STATE_ALIVE", "STATE_LEFT")}
    assert sorted(m["host"] for m in holders.values()) == \
        ["h0", "h0", "h0", "h2", "h2", "h2"], holders
    assert_finished_equal(j, fault_free)


def test_standby_host_loses_its_data_link(job, fault_free):
    """Two standbys per host. h1's data link goes down, and a worker on h0
    is killed at once: h1's standbys (of h0's topology block) are no
    candidates once the controller knows h1 is cut off, and one that took
    a slot first is evicted as soon as its peers cannot reach it. The job
    ends with the fault-free hash, and no standby of h1 trains to the
    end."""
    j = job(standbys=2)
    j.wait_step(100)
    j.net.hosts["h1"].set_link(False, nets=("d",))
    cut_at = time.time()
    victim = [pid for pid, n in j.names().items() if n == "h0-w0"][0]
    os.kill(victim, signal.SIGKILL)
    j.wait_end(hosts=["h0", "h2"], timeout=180)
    report(j, "standby's host cut off", cut_at, "h1")
    st = j.status()
    assert_only_evicted(st, ["h1", "h0"], j)
    h0_evicted = [i for i in incidents(st)
                  if i.get("evicted") and i.get("host") == "h0"]
    assert len(h0_evicted) == 1, h0_evicted  # the killed worker alone
    assert_finished_equal(j, fault_free, lost_hosts=["h1"])
    for n in ("h1-s0", "h1-s1"):
        assert j.final(n) is None, f"{n} trained on a host cut off"


def test_cut_from_the_controller_only_stops_acting(job, fault_free):
    """h1 loses the control network but keeps the data network: its
    members could go on training with their peers. The grace is raised to
    8 s (the lease stays 2 s) so that the lease is what stops them: no
    step is begun anywhere between the lease's end and the grace's."""
    j = job(controller_args=["--silent-after-ms", "8000", "--lease-ms",
                             str(int(LEASE_S * 1000))])
    j.wait_step(100)
    j.net.hosts["h1"].set_link(False, nets=("c",))
    cut_at = time.time()
    time.sleep(8.0 + 3.0)
    j.net.hosts["h1"].set_link(True, nets=("c",))
    j.wait_end()
    report(j, "cut from the controller", cut_at, "h1")
    st = j.status()
    mine, others = declared(st, "h1")
    assert others == [], others
    assert len([i for i in mine if i.get("slot", 0) >= 0]) == PER_HOST, mine
    begun = [t for e in j.progress().values() for _, t in e]
    quiet = [t for t in begun if cut_at + LEASE_S + 0.5 < t < cut_at + 7.5]
    assert quiet == [], (len(quiet), j.logs())
    assert_finished_equal(j, fault_free, lost_hosts=["h1"])
    for n in ("h1-w0", "h1-w1"):
        assert j.rc(n) == 3, (n, j.rc(n), j.logs())


@pytest.mark.parametrize("away_s", [1.0, 6.0])
def test_controller_away_for_a_while(job, fault_free, away_s):
    """The controller's host drops out and comes back: no generation
    changes, nobody is fenced. Training goes on while the lease lasts,
    then waits for the controller."""
    j = job()
    j.wait_step(100)
    gen = int(j.status().get("generation", 0))
    ctl = j.net.hosts["ctl"]
    ctl.set_link(False)
    cut_at = time.time()
    time.sleep(away_s)
    ctl.set_link(True)
    j.wait_end()
    report(j, f"controller away {away_s} s", cut_at)
    st = j.status()
    assert incidents(st) == [], (incidents(st), j.logs())
    assert int(st.get("generation", 0)) == gen
    assert_finished_equal(j, fault_free)
    begun = [t for e in j.progress().values() for _, t in e]
    # It trained while the lease lasted ...
    assert [t for t in begun if cut_at + 0.2 < t < cut_at + min(
        away_s, LEASE_S) - 0.2]
    if away_s > LEASE_S + 1:
        # ... and not after.
        assert [t for t in begun if cut_at + LEASE_S + 0.5 < t <
                cut_at + away_s - 0.1] == []


def test_whole_host_loss(job, fault_free):
    """Every process of h0 killed at once, and its links down: its pieces
    come back from buddies on other hosts."""
    j = job()
    j.wait_step(100)
    pids = j.host_pids("h0")
    j.net.hosts["h0"].set_link(False)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    cut_at = time.time()
    j.wait_end(hosts=["h1", "h2"])
    report(j, "whole host", cut_at, "h0")
    st = j.status()
    assert_host_lost(j, st, "h0", cut_at)
    assert_finished_equal(j, fault_free, lost_hosts=["h0"])
