#!/usr/bin/env python3
"""holdfast side by side with what users would pick instead, on one job.

Runs benchmarks/peers/trainer.py under each system, on 4 workers of this
machine, in one run: fault-free, then with one fault (SIGKILL or SIGSTOP
of one worker, by pid, when the job reaches a step), and reports for each

  step_ms      the median step time with no fault (rank 0's), and its
               ratio to plain torch DDP's (no fault tolerance)
  recovery_ms  from the fault to the completion of the first step begun
               after it (F + 2, F being the highest step completed before
               it: F + 1 may have been under way); it includes that step
  lost         steps completed before the fault and done again
  equal        whether every rank's final state (model, momentum, extra
               state) equals the system's fault-free one
  procs        the trainer processes the system holds (each would hold a
               GPU): its workers, and holdfast's standbys too; helpers
               that hold none (torchrun's agents, a Lighthouse, holdfast's
               launcher with its controller and host agent) are not
               counted

and the ratio holdfast/peer of each; the median of --repeat (3) runs of
each (a final model is "equal" only when it is in every run). Systems:
  plain     torch DDP on Gloo under torchrun, no fault tolerance (baseline)
  dcp       torchrun --max-restarts with a torch.distributed.checkpoint
            every --dcp-every steps
  nvrx      nvidia-resiliency-ext 0.4.1's ft_launcher (torchrun with
            in-job restarts and a rank monitor per rank that restarts on a
            missed heartbeat), with the dcp job's checkpoints
  torchft   torchft 0.2.0: one replica group per worker, each under its
            own torchrun that restarts it, and a Lighthouse
  holdfast  holdfast-run -n 4 --standby 1 --agent (its members behind a
            host agent, as on a cluster)

    .venv/bin/python3 benchmarks/peers/run.py [--state-mb 256] [--fault stop]
        [--systems holdfast,dcp,nvrx,torchft] [--ettr-seconds 120]
        [--repeat 3] [--json]

With --ettr-seconds, each system also runs about that long with a SIGKILL
every --fault-every (30) seconds, for ETTR: the steps done times plain
DDP's step time over the wall time (holdfast gets one standby per fault),
and ETTR per process: ETTR times the 4 workers over procs, the share of
the processes' (GPUs') time that trained.

The peers are installed by benchmarks/peers/setup.sh, which this calls.
"""

import argparse
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PYTHON = sys.executable
WORKERS = 4
# torchrun's restarts for the systems that restart a lost worker: never
# the limit (torchft 0.2.0's replicas also crash now and then after a
# fault, on an assertion in its DDP hook, and are restarted too).
RESTARTS = 100


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out, extra, args, system, restarts, env=None):
    launcher = extra.get("launcher", [PYTHON, "-m", "torch.distributed.run"])
    return subprocess.Popen(
        launcher + extra.get("launcher_args", []) + ["--nproc-per-node",
         str(extra.get("nproc", WORKERS)), "--max-restarts", str(restarts),
         "--monitor-interval", "0.1", "--standalone",
         str(HERE / "trainer.py"), "--system", system] + trainer_args(args)
        + extra.get("args", []),
        stdout=out, stderr=subprocess.STDOUT, env=env)


def trainer_args(args):
    return ["--steps", str(args.steps), "--step-ms", str(args.step_ms),
            "--state-mb", str(args.state_mb), "--timeout", str(args.timeout)]


def launch(system, args, work, log):
    """Starts `system`'s job; returns the processes to wait for and those
    to stop at the end (a Lighthouse)."""
    env = dict(os.environ, PEERS_OUT=str(work))
    if (ROOT / "build" / "python" / "holdfast").is_dir():
        env["PYTHONPATH"] = str(ROOT / "build" / "python")
    if system == "plain":
        return [torchrun(log, {}, args, "plain", 0, env)], []
    if system == "dcp":
        extra = {"args": ["--dcp-dir", str(work / "dcp"), "--dcp-every",
                          str(args.dcp_every)]}
        return [torchrun(log, extra, args, "dcp", RESTARTS, env)], []
    if system == "nvrx":
        extra = {"launcher": [str(pathlib.Path(PYTHON).parent / "ft_launcher")],
                 # A rank that misses its heartbeats for 3 s is hung (as
                 # holdfast's controller's default silence threshold).
                 "launcher_args": ["--ft-rank-heartbeat-timeout", "3",
                                   "--ft-initial-rank-heartbeat-timeout", "120",
                                   "--ft-restart-check-interval", "0.1",
                                   "--ft-workload-check-interval", "0.1"],
                 "args": ["--dcp-dir", str(work / "dcp"), "--dcp-every",
                          str(args.dcp_every)]}
        return [torchrun(log, extra, args, "nvrx", RESTARTS, env)], []
    if system == "torchft":
        port = free_port()
        lighthouse = subprocess.Popen(
            [str(pathlib.Path(PYTHON).parent / "torchft_lighthouse"),
             # A quorum goes on without one of the 4 (3 of them), and waits
             # up to 1 s for a replica that is still heartbeating.
             "--min_replicas", str(WORKERS - 1), "--quorum_tick_ms", "100",
             "--join_timeout_ms", "1000", "--bind", f"[::]:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)
        groups = []
        for g in range(WORKERS):
            genv = dict(env, REPLICA_GROUP_ID=str(g),
                        NUM_REPLICA_GROUPS=str(WORKERS),
                        TORCHFT_LIGHTHOUSE=f"http://localhost:{port}")
            groups.append(torchrun(log, {"nproc": 1}, args, "torchft", RESTARTS, genv))
        return groups, [lighthouse]
    if system == "holdfast":
        p = subprocess.Popen(
            [str(ROOT / "build" / "holdfast-run"), "-n", str(WORKERS),
             "--standby", str(args.standbys), "--no-disk-tier", "--agent",
             "--log-dir", str(work / "log"),
             "--", PYTHON, str(HERE / "trainer.py"), "--system", "holdfast",
             "--snapshot-every", str(args.snapshot_every)]
            + trainer_args(args),
            stdout=log, stderr=subprocess.STDOUT, env=env)
        return [p], []
    raise ValueError(system)


def progress(work):
    """rank -> [(step, unix ns)] so far."""
    found = {}
    for f in work.glob("progress-*"):
        events = []
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                events.append((int(parts[0]), int(parts[1])))
        found[int(f.name.split("-")[1])] = events
    return found


def signal_rank(work, rank, sig):
    """Sends `sig` to the process that holds `rank` now; its pid, or None
    when it is gone."""
    try:
        pid = int((work / f"pid-{rank}").read_text())
        os.kill(pid, sig)
        return pid
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None


def run_job(system, args, fault, every_s=0.0):
    """One run; returns its progress, the faults' times and the final hash.

    `fault` ("kill", "stop" or None) once the job reaches --fault-step, on
    --fault-rank; or, with `every_s`, a SIGKILL every `every_s` seconds
    from the first completed step on, on ranks 1, 2, 3, 1, ... in turn."""
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"peers-{system}-"))
    log = open(work / "output.log", "w")
    procs, helpers = launch(system, args, work, log)
    faults, stopped = [], None
    first_ns = None
    deadline = time.time() + args.limit
    try:
        while any(p.poll() is None for p in procs):
            if time.time() > deadline:
                break
            if every_s:
                now = time.time_ns()
                if first_ns is None:
                    f0 = work / "progress-0"
                    if f0.exists() and f0.stat().st_size > 0:
                        first_ns = now
                elif now - first_ns >= every_s * 1e9 * (len(faults) + 1):
                    for rank in (1 + (len(faults) + k) % (WORKERS - 1)
                                 for k in range(WORKERS - 1)):
                        if signal_rank(work, rank, signal.SIGKILL):
                            break
                    faults.append(now)
                time.sleep(0.02)
                continue
            final = work / "final"
            if final.exists() and time.time() - final.stat().st_mtime > 5:
                # Finished. A process still there waits for what will not
                # come (torchft: the stopped replica's torchrun, or the one
                # it restarted, waiting for a quorum); it is stopped below.
                break
            if fault and not faults:
                done = max((e[-1][0] for e in progress(work).values() if e),
                           default=0)
                if done >= args.fault_step:
                    faults.append(time.time_ns())
                    sig = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
                    pid = signal_rank(work, args.fault_rank, sig)
                    stopped = pid if fault == "stop" else None
            time.sleep(0.002)
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs + helpers:
            if p.poll() is None:
                p.kill()
            p.wait()
        log.close()
    final = (work / "final").read_text().split() if (work / "final").exists() \
        else None
    # Every rank's final hash (a replaced rank's successor writes it).
    finals = {f.name: f.read_text().split()[1]
              for f in work.glob("final-*") if not f.name.endswith(".tmp")}
    return {"work": str(work), "progress": progress(work),
            "fault_ns": faults[0] if faults else None, "faults": len(faults),
            "final": final, "finals": finals,
            "timed_out": time.time() > deadline}


def ettr(system, args, plain_step_ms):
    """A run of about --ettr-seconds with a SIGKILL every --fault-every
    seconds: (ETTR, faults). ETTR is the steps done times plain DDP's
    fault-free step time over the wall time from the first completed step
    to the last, so a system's steady-state overhead counts too."""
    steps = max(1, int(args.ettr_seconds * 1000 / plain_step_ms))
    sub = argparse.Namespace(**dict(vars(args), steps=steps,
                                    limit=args.ettr_seconds * 4 + 120))
    run = run_job(system, sub, None, every_s=args.fault_every)
    times = [t for evs in run["progress"].values() for _, t in evs]
    done = int(run["final"][0]) if run["final"] else 0
    if not times or done < steps:
        return None, run["faults"]
    wall_ms = (max(times) - min(times)) / 1e6
    return steps * plain_step_ms / wall_ms, run["faults"]


def step_ms(run):
    events = sorted(run["progress"].get(0, []))
    times = [t for _, t in events]
    gaps = [(b - a) / 1e6 for a, b in zip(times[10:], times[11:])]
    return statistics.median(gaps) if gaps else None


def recovery(run):
    """(ms from the fault to the completion of the first step begun after
    it, steps done again). With F the highest step any rank had completed
    at the fault, step F + 1 may have been under way (its all-reduce even
    done), so the first step begun after the fault is F + 2."""
    f = run["fault_ns"]
    if f is None:
        return None, None
    events = [e for evs in run["progress"].values() for e in evs]
    before = max((s for s, t in events if t <= f), default=0)
    after = [(s, t) for s, t in events if t > f]
    new = [t for s, t in after if s >= before + 2]
    redone = [s for s, t in after if s <= before]
    rec = (min(new) - f) / 1e6 if new else None
    lost = before - min(redone) + 1 if redone else 0
    return rec, lost


def measure(system, args):
    row = {"system": system}
    clean = run_job(system, args, None)
    row["step_ms"] = step_ms(clean)
    row["final_ok"] = clean["final"] is not None and \
        int(clean["final"][0]) == args.steps
    if system == "plain":
        return row
    faulted = run_job(system, args, args.fault)
    row["recovery_ms"], row["lost"] = recovery(faulted)
    row["finished"] = faulted["final"] is not None and \
        int(faulted["final"][0]) >= args.steps
    # Every rank of both runs ended with one hash: the fault-free run's.
    row["equal"] = bool(row["finished"] and clean["final"] and
                        len(faulted["finals"]) == WORKERS and
                        set(faulted["finals"].values()) ==
                        set(clean["finals"].values()) == {clean["final"][1]})
    row["logs"] = faulted["work"]
    return row


def processes(system, args):
    """The trainer processes `system` holds (see procs above)."""
    return WORKERS + (args.standbys if system == "holdfast" else 0)


def median_row(runs):
    """One row from --repeat runs of measure(): the median of each figure
    (None when any run lacks it), `equal` and `finished` only when true
    in every run, and each run's figures under "runs"."""
    row = {"system": runs[0]["system"], "runs": runs}
    for key in ("step_ms", "recovery_ms", "lost"):
        vals = [r.get(key) for r in runs]
        if key in runs[0]:
            row[key] = None if None in vals else statistics.median(vals)
    for key in ("final_ok", "finished", "equal"):
        if key in runs[0]:
            row[key] = all(r[key] for r in runs)
    return row


def fmt(v, digits=1):
    return "-" if v is None else f"{v:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="plain,holdfast,dcp,nvrx,torchft")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--state-mb", type=int, default=0)
    ap.add_argument("--fault", choices=["kill", "stop"], default="kill")
    ap.add_argument("--fault-step", type=int, default=100)
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--dcp-every", type=int, default=20)
    ap.add_argument("--snapshot-every", type=int, default=1,
                    help="holdfast's in-memory snapshot every k steps (a "
                    "fault loses up to k steps; the dcp job's checkpoint "
                    "interval is --dcp-every)")
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="torchft's and the dcp job's collective timeout, s")
    ap.add_argument("--limit", type=float, default=300.0,
                    help="seconds a run may take before it is stopped")
    ap.add_argument("--ettr-seconds", type=float, default=0.0,
                    help="also measure ETTR over a run of about this long "
                    "with a SIGKILL every --fault-every seconds (0: not)")
    ap.add_argument("--fault-every", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each measurement; the medians are "
                    "reported, and each run under --json")
    ap.add_argument("--no-setup", action="store_true",
                    help="do not run benchmarks/peers/setup.sh")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not args.no_setup:
        subprocess.run(["bash", str(HERE / "setup.sh")], check=True)
    systems = args.systems.split(",")
    # holdfast's standbys: one per fault (torchft and torchrun restart the
    # killed worker instead).
    args.standbys = 1 if not args.ettr_seconds else max(
        1, int(args.ettr_seconds // args.fault_every) + 1)
    rows = [median_row([measure(s, args) for _ in range(args.repeat)])
            for s in systems]
    base = next((r["step_ms"] for r in rows if r["system"] == "plain"), None)
    if args.ettr_seconds and base:
        for r in rows:
            if r["system"] != "plain":
                runs = [ettr(r["system"], args, base)
                        for _ in range(args.repeat)]
                vals = [e for e, _ in runs]
                r["ettr"] = None if None in vals else statistics.median(vals)
                r["ettr_runs"] = [{"ettr": e, "faults": f} for e, f in runs]
    hf = next((r for r in rows if r["system"] == "holdfast"), None)
    for r in rows:
        r["procs"] = processes(r["system"], args)
        if r.get("ettr") is not None:
            r["ettr_per_proc"] = r["ettr"] * WORKERS / r["procs"]
        r["step_vs_plain"] = r["step_ms"] / base if base and r["step_ms"] else None
        if hf and r is not hf and r.get("recovery_ms") and hf.get("recovery_ms"):
            r["holdfast_recovery_ratio"] = hf["recovery_ms"] / r["recovery_ms"]
        if hf and r is not hf and r.get("step_ms") and hf.get("step_ms"):
            r["holdfast_step_ratio"] = hf["step_ms"] / r["step_ms"]
    if args.json:
        print(json.dumps({"args": vars(args), "rows": rows}, indent=2))
        return 0
    print(f"medians of {args.repeat} run(s); "
          f"4 workers, {args.steps} steps of {args.step_ms} ms compute, "
          f"{args.state_mb} MiB extra state per rank, fault: {args.fault} of "
          f"rank {args.fault_rank} at step {args.fault_step}")
    print(f"{'system':<9} {'procs':>5} {'step ms':>8} {'vs plain':>8} "
          f"{'recovery ms':>11} {'lost':>5} {'equal':>6} {'hf/peer rec':>11} "
          f"{'hf/peer step':>12} {'ETTR':>6} {'/proc':>6}")
    for r in rows:
        print(f"{r['system']:<9} {r['procs']:>5} {fmt(r['step_ms'], 2):>8} "
              f"{fmt(r['step_vs_plain'], 3):>8} {fmt(r.get('recovery_ms')):>11} "
              f"{fmt(r.get('lost'), 0) if r.get('lost') is not None else '-':>5} "
              f"{str(r.get('equal', '-')):>6} "
              f"{fmt(r.get('holdfast_recovery_ratio'), 3):>11} "
              f"{fmt(r.get('holdfast_step_ratio'), 3):>12} "
              f"{fmt(r.get('ettr'), 3):>6} {fmt(r.get('ettr_per_proc'), 3):>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
