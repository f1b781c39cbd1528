#!/usr/bin/env python3
"""Network fault benchmark: the data-link and gray-network cases of
test/network/test_network.py (netns test hosts: 3 worker hosts of 2
workers and a standby each, and the controller's host), run --rounds
times.

Each case's test asserts the verdict: the culprit host (or link) and the
incident kind, that no healthy member is evicted, and the fault-free
hash. So a case is right when its test passes. Per case it prints the
runs, the share right, the time from the fault to the first incident
(p50, p90), and the members evicted per fault against restarting every
worker (6), the baseline of a job without diagnosis.

    benchmarks/network_bench.py [--rounds 3] [--json]

Needs root (ip netns, nftables) and the build (HOLDFAST_BUILD_DIR, default
build/). Each round runs one fault-free job and the five cases, about 6
minutes on the 2-core development VM.
"""

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORLD = 6
# test function -> the case its report line names
CASES = {
    "test_data_link_cut_for_good": "data link cut for good",
    "test_data_link_flapping": "data link flapping",
    "test_one_pair_blocked": "one pair blocked",
    "test_lossy_data_link_names_its_host": "lossy data link",
    "test_lossy_data_link_replaced_under_the_straggler_policy":
        "lossy data link, replace",
}
LINE = re.compile(r"network-case (.+?): detect_s=(\S+) .* evicted=(\d+)")


def one_round():
    """{case: (passed, detect_s or None, evicted)} of one pytest run."""
    with tempfile.TemporaryDirectory() as d:
        junit = pathlib.Path(d) / "junit.xml"
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p",
             "no:cacheprovider", f"--junitxml={junit}",
             str(ROOT / "test/network/test_network.py"),
             "-k", " or ".join(CASES)],
            capture_output=True, text=True, cwd=ROOT)
        lines = {m.group(1): (m.group(2), int(m.group(3)))
                 for m in LINE.finditer(r.stdout)}
        passed = {}
        if junit.exists():
            for case in ET.parse(junit).getroot().iter("testcase"):
                failed = any(c.tag in ("failure", "error", "skipped")
                             for c in case)
                passed[case.get("name")] = not failed
    out = {}
    for test, case in CASES.items():
        detect, evicted = lines.get(case, ("-", 0))
        out[case] = (passed.get(test, False),
                     None if detect == "-" else float(detect), evicted)
    return out


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("network_bench: needs root (ip netns, nftables)")
    runs = {case: [] for case in CASES.values()}
    for k in range(args.rounds):
        for case, result in one_round().items():
            runs[case].append(result)
        if not args.json:
            print(f"  round {k + 1} of {args.rounds} done", file=sys.stderr)
    rows = []
    for case, results in runs.items():
        detect = [d for ok, d, _ in results if ok and d is not None]
        evicted = [e for _, _, e in results]
        rows.append({
            "case": case, "runs": len(results),
            "right": sum(ok for ok, _, _ in results) / max(1, len(results)),
            "detect_s_p50": pct(detect, 0.5), "detect_s_p90": pct(detect, 0.9),
            "evicted_per_fault": statistics.mean(evicted) if evicted else 0,
            "vs_restart": (statistics.mean(evicted) / WORLD) if evicted else 0,
        })
    if args.json:
        print(json.dumps({"rounds": args.rounds, "rows": rows}, indent=1))
        return
    print(f"\n{'case':26} {'runs':>4} {'right':>6} {'p50 s':>6} {'p90 s':>6} "
          f"{'evict/f':>8} {'vs restart':>10}")
    for r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        print(f"{r['case']:26} {r['runs']:4d} {100 * r['right']:5.0f}% "
              f"{fmt(r['detect_s_p50']):>6} {fmt(r['detect_s_p90']):>6} "
              f"{r['evicted_per_fault']:8.2f} {r['vs_restart']:9.2f}x")
    print("\nright: the case's test passed (culprit and kind named, no healthy "
          "member evicted, the fault-free hash); p50/p90: fault to the first "
          "incident; vs restart: evictions against restarting all "
          f"{WORLD} workers.")


if __name__ == "__main__":
    main()
