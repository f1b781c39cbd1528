"""What the multi-host job tests (test/agent, test/network) read of the
processes their hosts' launchers (test/network/host_launcher.sh) start:
each process NAME leaves NAME.pid, NAME.out, NAME.err and NAME.rc in one
directory. A test's Job class takes this as a base, with `out` (that
directory) and `launchers` (host name: its launcher's Popen)."""

import subprocess
import time


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
