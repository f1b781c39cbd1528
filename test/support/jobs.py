"""The Python tests' one job harness.

- launch(): runs one launcher command (holdfast-run, for the one-host job
  tests of test/python) to its end, with a timeout that dumps every
  process's stacks before it kills them;
- final_lines(): the final lines of a job's output;
- LaunchedProcesses: what the multi-host job tests (test/agent,
  test/network) read of the processes their hosts' launchers
  (test/network/host_launcher.sh) start: each process NAME leaves
  NAME.pid, NAME.out, NAME.err and NAME.rc in one directory. A test's Job
  class takes it as a base, with `out` (that directory) and `launchers`
  (host name: its launcher's Popen)."""

import json
import os
import signal
import subprocess
import time


def controller_status(build, address, token):
    """`holdfast status --json` of the controller at `address` (every
    incident kept); RuntimeError with its stderr when it does not answer."""
    r = subprocess.run(
        [str(build / "holdfast"), "status", "--controller", address,
         "--json", "--incidents", "1000"],
        env=dict(os.environ, HOLDFAST_JOB_TOKEN=token),
        capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout)


def launch(argv, env, timeout):
    """Runs `argv` with `env` until it ends; returns (exit code, output
    lines). Past `timeout` seconds every process of the job prints its
    threads' stacks (the examples register faulthandler for SIGUSR1), then
    all of them are killed, and AssertionError carries the last lines."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = descendants(p.pid)
        signal_all(tree, signal.SIGUSR1)
        time.sleep(3)
        signal_all([p.pid] + tree, signal.SIGKILL)
        out, _ = p.communicate()
        _keep_log(out)
        lines = out.splitlines()
        raise AssertionError(
            f"the job did not end within {timeout} s; its last lines:\n" +
            "\n".join(lines[-400:])) from None
    _keep_log(out)
    return p.returncode, out.splitlines()


_job_logs = 0


def _keep_log(out):
    """With HOLDFAST_TEST_JOB_LOG_DIR set, keeps each job's whole output
    there (job-N.log): a failure's message shows only its last lines."""
    global _job_logs
    folder = os.environ.get("HOLDFAST_TEST_JOB_LOG_DIR")
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    _job_logs += 1
    with open(os.path.join(folder, f"job-{os.getpid()}-{_job_logs}.log"),
              "w") as f:
        f.write(out)


def descendants(pid):
    """The pids of every process below `pid` (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def final_lines(lines):
    """The final lines of a holdfast-run job's output ("final step=..."),
    without the launcher's prefix."""
    return [line.split("] ", 1)[1] for line in lines
            if "] final step=" in line]


class LaunchedProcesses:
    out = None
    launchers = None

    def all_names(self):
        """Every process a launcher started (it wrote a pid file)."""
        return sorted(f.stem for f in self.out.glob("*.pid"))

    def rc(self, name):
        f = self.out / f"{name}.rc"
        return int(f.read_text()) if f.exists() else None

    def final(self, name):
        """(step, world, hash) of a process's final line, or None."""
        f = self.out / f"{name}.out"
        for line in f.read_text().splitlines() if f.exists() else []:
            if line.startswith("final "):
                kv = dict(p.split("=") for p in line.split()[1:])
                return int(kv["step"]), int(kv["world"]), kv["params_sha256"]
        return None

    def finals(self):
        """The final lines of the processes that finished training."""
        return {n: f for n in self.all_names() if (f := self.final(n))}

    def wait_end(self, hosts, timeout):
        """Waits for the launchers of `hosts` to end (their processes did)."""
        deadline = time.time() + timeout
        for name in hosts:
            try:
                self.launchers[name].wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError(
                    f"{name}'s processes did not end\n{self.logs()}")

    def log_tails(self, files, lines):
        """The last `lines` lines of each of `files` that exists."""
        parts = []
        for f in files:
            text = f.read_text().splitlines() if f.exists() else []
            parts.append(f"--- {f.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)
