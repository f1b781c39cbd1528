#!/usr/bin/env python3
"""Controller failover: the time from killing the controller (SIGKILL)
to the first step committed after it, on netns test hosts
(test/network/test_ha.py: 3 nodes of 2 workers and a standby).

- elected: two holdfast-controllers on etcd (3 members); the leader is
  killed and the other takes over.
- baseline: one controller, restarted on the same host at once (what a
  supervisor such as systemd does at best); members resume with it.

Prints each run, the medians and their ratio (elected / baseline).

    benchmarks/failover_bench.py [--runs 5] [--json]

Needs root (ip netns) and etcd (Debian's etcd-server), and the build
(HOLDFAST_BUILD_DIR, default build/). About 20 s per run.
"""

import argparse
import json
import pathlib
import signal
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test/network"))
import netns  # noqa: E402
import test_ha  # noqa: E402


def committed(j):
    try:
        st = j.status()
    except RuntimeError:
        return None, None
    return int(st.get("committed_step", -1)), int(st.get("epoch", 0))


def one_run(net, out, elected):
    """Seconds from the kill to the first commit after it."""
    j = test_ha.HaJob(net, out, elected=elected)
    try:
        for h in test_ha.NODES:
            j.start(h)
        j.wait_step(150)
        before, epoch = committed(j)
        victim = test_ha.CONTROLLERS[0]
        assert j.leader() in (victim, None)
        killed = time.time()
        j.procs[f"ctl-{victim}"].send_signal(signal.SIGKILL)
        if not elected:
            j.procs[f"ctl-{victim}"].wait()
            j.start_controller(victim)
        while time.time() - killed < 60:
            step, now_epoch = committed(j)
            if step is not None and step > before and \
                    (not elected or now_epoch > epoch):
                return time.time() - killed
            time.sleep(0.02)
        raise AssertionError(f"no commit within 60 s\n{j.logs()}")
    finally:
        j.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    why = netns.available() or test_ha.etcd_available()
    if why:
        print(f"failover_bench: {why}", file=sys.stderr)
        return 77
    net = netns.TestNet([(h, "c") for h in test_ha.ETCD + test_ha.CONTROLLERS]
                        + [(h, "dc") for h in test_ha.NODES])
    times = {"elected": [], "baseline": []}
    try:
        with tempfile.TemporaryDirectory() as d:
            for i in range(args.runs):
                for kind in times:
                    t = one_run(net, pathlib.Path(d) / f"{kind}{i}",
                                kind == "elected")
                    times[kind].append(round(t, 3))
                    print(f"run {i} {kind}: kill to first commit {t:.2f} s",
                          file=sys.stderr)
    finally:
        net.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"runs": times, "median_s": med,
              "ratio_elected_to_baseline": med["elected"] / med["baseline"]}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"failover (kill to first commit), median of {args.runs}: "
              f"elected {med['elected']:.2f} s, lone controller restarted "
              f"at once {med['baseline']:.2f} s, ratio "
              f"{result['ratio_elected_to_baseline']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
