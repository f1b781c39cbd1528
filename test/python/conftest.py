"""Fixtures for the Python tests: the build's binaries and a standalone
holdfast-controller per test. CTest sets HOLDFAST_BUILD_DIR and PYTHONPATH
(scripts/test.sh runs them). With HOLDFAST_INSTALLED=1 they test the
package that `pip install .` put into the running interpreter's
environment instead: its module, and the launcher and controller it
bundles (scripts/test_install.sh); only the libtorch trainer still comes
from the build."""

import os
import pathlib
import subprocess
import sys
import tempfile
import time

import pytest

# The job harness every Python test shares (test/support/jobs.py).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] /
                       "support"))
from jobs import final_lines, launch  # noqa: E402,F401

BUILD = pathlib.Path(
    os.environ.get("HOLDFAST_BUILD_DIR",
                   pathlib.Path(__file__).resolve().parents[2] / "build")
)
ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("HOLDFAST_INSTALLED") == "1"


def _tool(name):
    """A holdfast binary: the build's, or the installed package's."""
    if INSTALLED:
        import holdfast

        return pathlib.Path(holdfast.__file__).parent / "bin" / name
    return BUILD / name

# The interpreter that runs the tests runs the jobs too (the project's
# virtual environment, with its pinned torch).
PYTHON = sys.executable


@pytest.fixture
def controller(tmp_path):
    """A holdfast-controller for a one-slot job: (address, token)."""
    token = "python-test-token"
    (tmp_path / "token").write_text(token)
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [str(_tool("holdfast-controller")), "--port", "0", "--world-size",
         "1", "--token-file", str(tmp_path / "token"), "--port-file",
         str(port_file)],
        stderr=open(tmp_path / "controller.log", "w"),
    )
    deadline = time.time() + 30
    while not port_file.exists():
        assert proc.poll() is None, "holdfast-controller exited"
        assert time.time() < deadline, "holdfast-controller did not start"
        time.sleep(0.05)
    yield f"127.0.0.1:{port_file.read_text().strip()}", token
    proc.kill()
    proc.wait()


def run_job(args, cmd, timeout=None, extra_env=None):
    """Runs `holdfast-run ARGS -- CMD` (with `extra_env` added to the
    environment); returns (exit code, output lines). `timeout`: seconds
    (default HOLDFAST_TEST_JOB_TIMEOUT, else 240)."""
    if timeout is None:
        timeout = float(os.environ.get("HOLDFAST_TEST_JOB_TIMEOUT", "240"))
    env = dict(os.environ)
    env.update(extra_env or {})
    if INSTALLED:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = str(BUILD / "python")
    # A disk tier of the job's own: no run resumes another's checkpoint.
    if "--checkpoint-dir" not in args and "--no-disk-tier" not in args:
        env.setdefault("HOLDFAST_CHECKPOINT_DIR", tempfile.mkdtemp())
    return launch([str(_tool("holdfast-run"))] + args + ["--"] + cmd, env,
                  timeout)


HERE = pathlib.Path(__file__).resolve().parent
DDP = [PYTHON, str(ROOT / "examples/python/ddp_train.py"), "--steps", "30"]
FSDP = [PYTHON, str(ROOT / "examples/python/fsdp_train.py"), "--steps", "30"]
PP_DDP = [PYTHON, str(ROOT / "examples/python/pp_ddp_train.py"), "--steps",
          "30"]
GPT = [PYTHON, str(ROOT / "examples/python/gpt_train.py"), "--steps", "30",
       "--device", "cpu"]

_fault_free = {}


def _without_step_ms(job):
    if "--step-ms" not in job:
        return list(job)
    i = job.index("--step-ms")
    return job[:i] + job[i + 2:]


def fault_free_hash(ranks, job=DDP, extra_env=None):
    """The hash of `job` (an example) without faults on `ranks` slots (3 or
    more: on two, a sum's operands commute, so a change in the order of a
    reduction after a recovery would go unseen)."""
    # A sleep per step (--step-ms) changes no bits: runs that differ only
    # in it share their fault-free run.
    key = (ranks, tuple(_without_step_ms(job)))
    if key not in _fault_free:
        rc, lines = run_job(["-n", str(ranks), "--standby", "1"],
                            _without_step_ms(job), extra_env=extra_env)
        finals = final_lines(lines)
        assert rc == 0, "\n".join(lines[-40:])
        assert len(finals) == ranks and len(set(finals)) == 1, finals
        assert finals[0].startswith(f"final step=30 world={ranks} "
                                    "params_sha256=")
        # Its steps fence their writes before opt.step(), and nothing of
        # DDP's (its reducer, the all-reduce hook) writes registered tensors
        # before.
        assert_fenced(lines, ranks)
        _fault_free[key] = finals[0]
    return _fault_free[key]


def assert_fenced(lines, ranks):
    """The trainers print their snapshot counts on a line of their own:
    none of the slots' snapshots was dropped for a write before the
    fence, and some were copied during the next step (not all: one whose
    copy had not started when the fence came is copied by the fence, as
    between the steps)."""
    counts = [dict(kv.split("=") for kv in line.split("] ", 1)[1].split()[2:])
              for line in lines if "] recoveries=" in line]
    assert len(counts) == ranks, "\n".join(lines[-40:])
    assert all(c["snapshots_unfenced"] == "0" for c in counts), counts
    assert sum(int(c["snapshots_overlapped"]) for c in counts) > 0, counts


def worker_pid(log_dir, slot, step):
    """The pid of slot `slot`'s live worker once holdfast-run's
    LOG_DIR/members.json shows it at step `step` or later; None before."""
    import json

    try:
        with open(os.path.join(log_dir, "members.json")) as f:
            members = json.load(f).get("members", [])
    except (OSError, ValueError):
        return None
    for m in members:
        if (m.get("role") == "ROLE_WORKER" and m.get("slot") == slot
                and m.get("state") == "STATE_ALIVE"
                and m.get("step", -1) >= step):
            return m["pid"]
    return None


def signal_from_outside(log_dir, slot, step, sig, timeout=120):
    """Starts a thread that sends `sig` to slot `slot`'s live worker, found
    by its pid in holdfast-run's LOG_DIR/members.json once it is at step
    `step` or later, as an operator's tool would; returns the thread,
    whose `pid` is the process signalled (None if it never came). A
    stopped process is killed once the job has ended (join_signal)."""
    import threading

    def run():
        deadline = time.time() + timeout
        while time.time() < deadline and thread.pid is None:
            pid = worker_pid(log_dir, slot, step)
            if pid is not None:
                os.kill(pid, sig)
                thread.pid = pid
            time.sleep(0.005)

    thread = threading.Thread(target=run, daemon=True)
    thread.pid = None
    thread.sig = sig
    thread.start()
    return thread


def join_signal(thread):
    """Waits for a signal_from_outside thread; kills what it stopped."""
    import signal

    thread.join()
    if thread.pid is not None and thread.sig == signal.SIGSTOP:
        try:
            os.kill(thread.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return thread.pid


def assert_survives(ranks, fault, job, extra_env=None):
    """`job` on `ranks` slots and a standby, with `fault` injected, ends
    with every slot of the final world printing the fault-free hash after
    one recovery (the replaced member never prints).

    `fault`: an --inject spec (the rank does it to itself), or a tuple
    (slot, step, signal) sent from outside by pid (signal_from_outside)."""
    expected = fault_free_hash(ranks, job, extra_env)
    args = ["-n", str(ranks), "--standby", "1"]
    if isinstance(fault, tuple):
        log_dir = tempfile.mkdtemp()
        signaller = signal_from_outside(log_dir, *fault)
        try:
            rc, lines = run_job(args + ["--log-dir", log_dir], job,
                                extra_env=extra_env)
        finally:
            pid = join_signal(signaller)
        assert pid is not None, f"slot {fault[0]} never reached step {fault[1]}"
    else:
        rc, lines = run_job(args + ["--inject", fault], job,
                            extra_env=extra_env)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    finals = final_lines(lines)
    assert len(finals) == ranks, out
    assert set(finals) == {expected}, out
    assert any("recoveries=1" in line for line in lines), out
