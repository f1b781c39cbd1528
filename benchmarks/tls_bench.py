#!/usr/bin/env python3
"""What TLS on the control plane and the Gloo pairs' handshake cost: the
example trainer's step time and its recovery time from a SIGKILL, with
both (holdfast-run's default on one machine: mutual TLS with a private
CA, and the link handshake), with --no-tls, and with the handshake off
(HOLDFAST_LINK_HANDSHAKE=0), alternated in the same run.

Each run is holdfast-run -n 4 --standby 1 with holdfast-dp-trainer
(--steps 400 --step-ms 5), slot 1 killed at step 150. From summary.json:
the step time (productive_ms / steps, the recovery left out) and the
incident's detection plus recovery time (kill to the first step done).

Prints each run, the medians per mode, and for step time and recovery
both / no-TLS (what TLS costs) and both / no-handshake (what the
handshake costs).

    benchmarks/tls_bench.py [--runs 3] [--json]

Needs the build (HOLDFAST_BUILD_DIR, default build/). About 5 s a run.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("HOLDFAST_BUILD_DIR",
                                    ROOT / "build")).resolve()


MODES = ("plain", "tls", "nohs")  # no TLS; both; TLS without the handshake


def one_run(mode, out):
    """(step ms, recovery ms) of one job in `mode` (MODES)."""
    cmd = [str(BUILD / "holdfast-run"), "-n", "4", "--standby", "1",
           "--no-disk-tier", "--log-dir", str(out),
           "--inject", "kill:slot=1:step=150"]
    if mode == "plain":
        cmd.append("--no-tls")
    env = dict(os.environ)
    env["HOLDFAST_LINK_HANDSHAKE"] = "0" if mode == "nohs" else "1"
    cmd += ["--", str(BUILD / "holdfast-dp-trainer"), "--steps", "400",
            "--step-ms", "5"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=env)
    if r.returncode != 0:
        raise SystemExit(f"tls_bench: holdfast-run failed:\n{r.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    inc = [i for i in s.get("incidents", []) if "recovery_ms" in i]
    if s["outcome"] != "finished" or len(inc) != 1:
        raise SystemExit(f"tls_bench: unexpected summary: {s}")
    return (s["productive_ms"] / s["steps"],
            inc[0]["detect_ms"] + inc[0]["recovery_ms"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for mode in MODES:
                out = pathlib.Path(tmp) / f"{mode}-{i}"
                step, rec = one_run(mode, out)
                runs[mode].append({"step_ms": step, "recovery_ms": rec})
                if not args.json:
                    print(f"run {i} {mode:5s}: step {step:.3f} ms, "
                          f"recovery {rec} ms", flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs)
               for k in ("step_ms", "recovery_ms")}
           for m, rs in runs.items()}
    ratio = {k: med["tls"][k] / med["plain"][k]
             for k in ("step_ms", "recovery_ms")}
    hs = {k: med["tls"][k] / med["nohs"][k]
          for k in ("step_ms", "recovery_ms")}
    if args.json:
        print(json.dumps({"runs": runs, "median": med,
                          "tls_over_plain": ratio,
                          "handshake_over_none": hs}, indent=2))
        return
    for m in MODES:
        print(f"median {m:5s}: step {med[m]['step_ms']:.3f} ms, "
              f"recovery {med[m]['recovery_ms']:.0f} ms")
    print(f"tls / plain: step time {ratio['step_ms']:.3f}, "
          f"recovery {ratio['recovery_ms']:.3f}")
    print(f"handshake / none: step time {hs['step_ms']:.3f}, "
          f"recovery {hs['recovery_ms']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
