"""Members behind host agents (holdfast-agent; docs/controller.md, "Host
agents"), as real processes on this machine.

Three hosts h0, h1 and h2, each with its own agent on a Unix socket and 2
workers and 1 standby of holdfast-dp-trainer, started by the host's own
launcher (test/network/host_launcher.sh) with HOLDFAST_CONTROLLER pointing
at the host's agent: the members know no other address. Each test kills or
restarts something by pid from outside, and asserts on what the controller
recorded and on the final hashes against the fault-free run.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "support"))
from fuzz import PortFuzzer  # noqa: E402
from jobs import LaunchedProcesses  # noqa: E402

BUILD = pathlib.Path(os.environ.get(
    "HOLDFAST_BUILD_DIR",
    pathlib.Path(__file__).resolve().parents[2] / "build"))
LAUNCHER = pathlib.Path(__file__).resolve().parents[1] / "network" / \
    "host_launcher.sh"
TOKEN = "agent-test-token"
HOSTS = ["h0", "h1", "h2"]
PER_HOST = 2
WORLD = PER_HOST * len(HOSTS)
STEP_MS = 10
STEPS = 600


class Job(LaunchedProcesses):
    """A controller, an agent per host, and each host's launcher."""

    def __init__(self, out, metrics=False):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        (out / "token").write_text(TOKEN)
        self.controller = subprocess.Popen(
            [str(BUILD / "holdfast-controller"), "--world-size", str(WORLD),
             "--port", "0", "--port-file", str(out / "port"), "--token-file",
             str(out / "token"),
             # As a controller on another machine than the members: only
             # their agents see their processes.
             "--exit-watch-ms", "0"] + (["--metrics-port", "0"] if metrics
                                        else []),
            stdout=subprocess.DEVNULL,
            stderr=open(out / "controller.log", "w"))
        self.address = f"127.0.0.1:{self._wait_file(out / 'port')}"
        self.agents = {}
        self.launchers = {}
        for h in HOSTS:
            self.start_agent(h)
        for i, h in enumerate(HOSTS):
            env = dict(os.environ, HOLDFAST_CONTROLLER=self.socket(h),
                       HOLDFAST_JOB_TOKEN=TOKEN, HOLDFAST_LOG_LEVEL="info",
                       HOLDFAST_TRACE_DIR=str(out / "trace"))
            env.pop("HOLDFAST_CHECKPOINT_DIR", None)
            self.launchers[h] = subprocess.Popen(
                [str(LAUNCHER), str(out), h, str(i * PER_HOST), str(PER_HOST),
                 "1", "--", str(BUILD / "holdfast-dp-trainer"), "--steps",
                 str(STEPS), "--step-ms", str(STEP_MS), "--progress-dir",
                 str(out)], env=env)

    def _wait_file(self, path, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.controller.poll() is None, "the controller exited"
            if path.exists() and path.read_text().strip():
                return path.read_text().strip()
            time.sleep(0.05)
        raise AssertionError(f"{path} never appeared")

    def socket(self, host):
        return f"unix:{self.out / ('agent-' + host + '.sock')}"

    def start_agent(self, host):
        n = sum(1 for f in self.out.glob(f"agent-{host}*.log"))
        addr_file = self.out / f"agent-{host}.address"
        addr_file.unlink(missing_ok=True)
        self.agents[host] = subprocess.Popen(
            [str(BUILD / "holdfast-agent"), "--controller", self.address,
             "--listen", self.socket(host), "--token-file",
             str(self.out / "token"), "--host", host, "--address-file",
             str(addr_file)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.out / f"agent-{host}-{n}.log", "w"))
        assert self._wait_file(addr_file) == self.socket(host)

    def status(self):
        r = subprocess.run(
            [str(BUILD / "holdfast"), "status", "--controller", self.address,
             "--json", "--incidents", "1000"],
            env=dict(os.environ, HOLDFAST_JOB_TOKEN=TOKEN),
            capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def pid(self, name):
        return int((self.out / f"{name}.pid").read_text())

    def wait_step(self, step, timeout=120):
        """Waits until every worker has begun `step`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            done = 0
            for f in self.out.glob("progress-*"):
                lines = f.read_text().split()
                if lines and int(lines[-2]) >= step:
                    done += 1
            if done >= WORLD:
                return
            for h, p in self.launchers.items():
                assert p.poll() is None, f"{h}'s launcher ended\n{self.logs()}"
            time.sleep(0.05)
        raise AssertionError(f"the job did not reach step {step}")

    def wait_end(self, hosts=HOSTS, timeout=180):
        super().wait_end(hosts, timeout)

    def logs(self):
        return self.log_tails(sorted(self.out.glob("*.err")) +
                              sorted(self.out.glob("*.log")), 12)

    def close(self):
        for name in self.all_names():
            try:
                os.kill(self.pid(name), signal.SIGKILL)
            except ProcessLookupError:
                pass
        procs = [*self.launchers.values(), *self.agents.values(),
                 self.controller]
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def job(tmp_path):
    jobs = []

    def make(**kw):
        j = Job(tmp_path / f"job{len(jobs)}", **kw)
        jobs.append(j)
        return j

    yield make
    for j in jobs:
        j.close()


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory):
    j = Job(tmp_path_factory.mktemp("fault-free"))
    try:
        j.wait_end()
        workers = {n: f for n, f in j.finals().items() if "-w" in n}
        assert len(workers) == WORLD, j.logs()
        hashes = {f[2] for f in workers.values()}
        assert len(hashes) == 1, workers
        assert all(f[:2] == (STEPS, WORLD) for f in workers.values())
        st = j.status()
        assert not st.get("incidents"), st.get("incidents")
        return hashes.pop()
    finally:
        j.close()


def assert_finished_equal(j, want, lost=()):
    """Every slot's final holder finished with the fault-free hash; none of
    the processes in `lost` finished."""
    done = j.finals()
    assert len(done) == WORLD, (done, j.logs())
    for n, f in done.items():
        assert f == (STEPS, WORLD, want), (n, f, j.logs())
        assert n not in lost, n


def test_fault_free(fault_free):
    assert len(fault_free) == 64


def test_member_crash_is_seen_at_once(job, fault_free):
    j = job()
    j.wait_step(100)
    victim = j.pid("h1-w0")
    os.kill(victim, signal.SIGKILL)
    killed_at = time.time()
    j.wait_end()
    st = j.status()
    found = st.get("incidents", [])
    assert len(found) == 1, json.dumps(found, indent=1)
    inc = found[0]
    assert inc["kind"] == "INCIDENT_CRASHED", inc
    assert inc["host"] == "h1" and inc.get("evicted"), inc
    assert "on host agent h1" in inc["evidence"], inc
    # The agent sees the process begin to exit, or its local stream end,
    # whichever comes first: a small process's teardown can beat the
    # 5 ms poll (detection_test has the deterministic case, 1 GiB held).
    detect_s = int(inc["detected_unix_ms"]) / 1000 - killed_at
    print(f"agent-case member SIGKILL: detect_s={detect_s:.3f} "
          f"(seen in /proc: {'seen in /proc' in inc['evidence']})")
    assert detect_s < 1.0, inc
    assert_finished_equal(j, fault_free, lost=("h1-w0",))


def test_stopped_member_is_found_in_a_second(job, fault_free):
    """A SIGSTOPped member behind its agent: its local stream goes quiet
    while the agent is heard, so the controller declares it silent well
    before the 3 s grace that keeps link blips from costing a member."""
    j = job()
    j.wait_step(100)
    victim = j.pid("h1-w0")
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.time()
    deadline = stopped_at + 10
    while time.time() < deadline and not j.status().get("incidents"):
        time.sleep(0.1)
    os.kill(victim, signal.SIGCONT)  # it learns it was fenced, and exits
    j.wait_end()
    found = j.status().get("incidents", [])
    assert len(found) == 1, json.dumps(found, indent=1)
    inc = found[0]
    assert inc["kind"] == "INCIDENT_SILENT", inc
    assert inc["host"] == "h1" and inc.get("evicted"), inc
    assert "host agent on h1 heard nothing from it" in inc["evidence"], inc
    detect_s = int(inc["detected_unix_ms"]) / 1000 - stopped_at
    print(f"agent-case member SIGSTOP: detect_s={detect_s:.3f}")
    assert detect_s < 1.0, inc
    assert j.rc("h1-w0") == 3, (j.rc("h1-w0"), j.logs())
    assert_finished_equal(j, fault_free, lost=("h1-w0",))


def test_agent_crash_is_the_loss_of_its_host(job, fault_free):
    j = job()
    j.wait_step(100)
    j.agents["h1"].send_signal(signal.SIGKILL)
    killed_at = time.time()
    j.agents["h1"].wait()
    time.sleep(1.5)
    st = j.status()
    found = st.get("incidents", [])
    mine = [i for i in found if i["host"] == "h1"]
    others = [i for i in found if i["host"] != "h1"]
    assert others == [], json.dumps(others, indent=1)
    # Both workers and the standby of h1.
    assert len(mine) == PER_HOST + 1, json.dumps(mine, indent=1)
    for i in mine:
        assert i["kind"] == "INCIDENT_CRASHED", i
        assert "host agent's" in i["evidence"], i
        detect_s = int(i["detected_unix_ms"]) / 1000 - killed_at
        assert detect_s < 1.0, i
    print(f"agent-case agent SIGKILL: detect_s="
          f"{max(int(i['detected_unix_ms']) for i in mine) / 1000 - killed_at:.3f}")
    # The host's launcher brings an agent back; h1's old processes learn
    # through it that they were fenced, and exit.
    j.start_agent("h1")
    j.wait_end()
    h1 = [n for n in j.all_names() if n.startswith("h1-")]
    for n in h1:
        assert j.rc(n) == 3, (n, j.rc(n), j.logs())
    assert_finished_equal(j, fault_free, lost=h1)


def test_agent_restart_loses_nothing(job, fault_free):
    j = job()
    j.wait_step(100)
    gen = int(j.status().get("generation", 0))
    j.agents["h1"].send_signal(signal.SIGTERM)
    assert j.agents["h1"].wait(timeout=10) == 0
    time.sleep(0.3)  # the members find no agent meanwhile
    j.start_agent("h1")
    j.wait_end()
    st = j.status()
    assert st.get("incidents", []) == [], (st.get("incidents"), j.logs())
    assert int(st.get("generation", 0)) == gen
    assert_finished_equal(j, fault_free)
    for n in j.all_names():
        assert j.rc(n) == 0, (n, j.rc(n), j.logs())
        if "-s" in n:
            assert j.final(n) is None, n
    # h1's members did lose their streams, and came back.
    for n in [n for n in j.all_names() if n.startswith("h1-")]:
        err = (j.out / f"{n}.err").read_text()
        assert "heartbeat stream back" in err, (n, err[-2000:])


def test_hostile_connections_to_every_port_and_socket(job, fault_free):
    """Issue 59's fuzzing with host agents: every TCP port and Unix socket
    that the controller (its gRPC port and its Prometheus metrics port),
    the three host agents (their sockets) and the members under the hosts'
    launchers (Gloo pairs' and backup links' listeners) listen on takes
    random bytes, HTTP/2's preface and garbage, link hellos with garbage,
    replayed handshakes and silent connections (test/support/fuzz.py),
    while a member is killed at step 100. The job ends with the fault-free
    hash, and the only incident is the kill."""
    j = job(metrics=True)
    fuzzer = PortFuzzer(j.controller.pid,
                        *[p.pid for p in j.agents.values()],
                        *[p.pid for p in j.launchers.values()]).start()
    try:
        j.wait_step(100)
        os.kill(j.pid("h1-w0"), signal.SIGKILL)
        j.wait_end()
    finally:
        hits = fuzzer.stop()
    st = j.status()
    found = [i["kind"] for i in st.get("incidents", [])]
    assert found == ["INCIDENT_CRASHED"], (found, hits, j.logs())
    assert_finished_equal(j, fault_free, lost=("h1-w0",))
    # The controller's two ports and every agent's socket were attacked.
    assert len(hits.get("controller", {})) >= 2, hits
    assert len(hits.get("agent", {})) == len(HOSTS), hits
    for h in HOSTS:
        assert j.agents[h].poll() is None, f"agent {h} died"
    assert j.controller.poll() is None, "the controller died"
