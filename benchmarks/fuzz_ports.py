#!/usr/bin/env python3
"""Hostile connections to every port a job listens on (issue 59): whether
a 4-rank job with a standby still ends with its fault-free hash.

While the job runs, test/support/fuzz.py's PortFuzzer attacks every
port that holdfast-run (the controller) and the processes under it (the
members: their Gloo pairs' and backup links' listeners, open while a
generation is being built) listen on: random bytes, HTTP/2's preface and
garbage, backup-link and Gloo-link hellos with garbage, replays of the
job's own handshakes recorded on lo (as root), silent connections. The
same job without the fuzzer, in the same run, gives the reference
hash. The job is holdfast-run -n 4 --standby 1 with holdfast-dp-trainer
(--steps 300 --step-ms 5) and slot 1 killed at step 150 (--inject; a
recovery builds new listeners).

Prints the ports hit by owner, the job's outcome, incidents and
recoveries, and whether its hash is the reference's; exit code 0 only
when every fuzzed run ended with it.

    benchmarks/fuzz_ports.py [--runs 1] [--inject SPEC] [--json]

Needs the build (HOLDFAST_BUILD_DIR, default build/). About 10 s a run.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("HOLDFAST_BUILD_DIR",
                                    ROOT / "build")).resolve()
sys.path.insert(0, str(ROOT / "test" / "support"))
from fuzz import PortFuzzer  # noqa: E402


def run_job(out, inject, fuzzed):
    cmd = [str(BUILD / "holdfast-run"), "-n", "4", "--standby", "1",
           "--no-disk-tier", "--log-dir", str(out)]
    if inject:
        cmd += ["--inject", inject]
    cmd += ["--", str(BUILD / "holdfast-dp-trainer"), "--steps", "300",
            "--step-ms", "5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    fuzzer = PortFuzzer(proc.pid)
    if fuzzed:
        fuzzer.start()
    lines = proc.communicate(timeout=300)[0].splitlines()
    if fuzzed:
        fuzzer.stop()
    finals = sorted({ln.split("params_sha256=")[1] for ln in lines
                     if "final step=" in ln and "params_sha256=" in ln})
    try:
        s = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        s = {}
    return {
        "rc": proc.returncode,
        "outcome": s.get("outcome", "no summary"),
        "hashes": finals,
        "incidents": [i.get("kind") for i in s.get("incidents", [])],
        "recoveries": len(s.get("recoveries", [])),
        "ports_hit": {k: len(v) for k, v in fuzzer.hits.items()},
        "connections": fuzzer.connections(),
        "replays": fuzzer.replays,
        "first_errors": [ln for ln in lines if "] error: " in ln][:6],
        "last_lines": lines[-15:],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--inject", default="kill:slot=1:step=150")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ref = run_job(pathlib.Path(tmp) / "ref", args.inject, False)
        if ref["rc"] != 0 or len(ref["hashes"]) != 1:
            sys.exit("fuzz_ports: the reference job failed:\n"
                     + "\n".join(ref["last_lines"]))
        runs = []
        for i in range(args.runs):
            r = run_job(pathlib.Path(tmp) / f"fuzz{i}", args.inject, True)
            r["survived"] = r["rc"] == 0 and r["hashes"] == ref["hashes"]
            runs.append(r)
    if args.json:
        print(json.dumps({"reference": ref["hashes"], "runs": runs},
                         indent=1))
    else:
        for r in runs:
            print(f"{'survived' if r['survived'] else 'FAILED'}: rc "
                  f"{r['rc']}, {r['outcome']}, {r['connections']} hostile "
                  f"connections to {r['ports_hit']} ports ({r['replays']} "
                  f"replayed handshakes), incidents "
                  f"{r['incidents']}, {r['recoveries']} recoveries")
            if not r["survived"]:
                print("  " + "\n  ".join(r["first_errors"] + r["last_lines"]))
    sys.exit(0 if all(r["survived"] for r in runs) else 1)


if __name__ == "__main__":
    main()
