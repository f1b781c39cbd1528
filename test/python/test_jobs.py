"""Whole jobs under holdfast-run: the collectives on torch tensors, and the
PyTorch DDP example with real faults (SIGKILL, SIGSTOP) in replace mode,
which must end with the fault-free parameter hash, and in shrink mode."""

import json
import os
import pathlib
import re
import signal
import threading
import time

import pytest

from conftest import (BUILD, DDP, GPT, HERE, PYTHON, assert_fenced,
                      assert_survives, fault_free_hash, final_lines, run_job,
                      worker_pid)
from fuzz import PortFuzzer


def test_collectives_on_torch_tensors():
    rc, lines = run_job(["-n", "3"], [PYTHON, str(HERE / "collectives_job.py")])
    oks = sorted(line.split("] ", 1)[1] for line in lines if "] ok rank=" in line)
    assert rc == 0, "\n".join(lines[-40:])
    assert oks == [f"ok rank={r} marker=3" for r in range(3)]


# A kill early, midway and late in the run and on every slot: the first
# step after a restore runs on a freshly built DDP (its buckets in their
# initial layout, where the fault-free run at that step had rebuilt them),
# so every one of these would show a reduction whose order depends on a
# bucket's layout. (Four more kills at other steps added 100 s to CI and
# nothing these do not see; holdfast-chaos soaks a trainer with kills at
# random steps: docs/benchmarks.md.)
@pytest.mark.parametrize("ranks,fault", [
    (3, "kill:slot=1:step=5"), (3, "kill:slot=2:step=13"),
    (3, "kill:slot=0:step=22"), (3, "hang:slot=0:step=8"),
    (3, "fail-op:slot=1:seq=15"), (4, "kill:slot=3:step=7"),
    (4, "hang:slot=2:step=11"),
])
def test_ddp_survives_a_fault_with_the_fault_free_hash(ranks, fault):
    assert_survives(ranks, fault, DDP)


# The same faults sent from outside, by pid, while the rank is anywhere in
# its step (50 ms of it a sleep): (slot, step, signal).
@pytest.mark.parametrize("fault", [(1, 8, signal.SIGSTOP),
                                   (2, 10, signal.SIGKILL)])
def test_ddp_survives_a_signal_from_outside_with_the_fault_free_hash(fault):
    assert_survives(3, fault, DDP + ["--step-ms", "50"])


def test_gpt_survives_a_kill_with_the_fault_free_hash():
    """The GPT example (3.3M parameters, AdamW, a corpus Debian ships) on 3
    slots: a SIGKILL of slot 1 at step 12 ends with the fault-free hash of
    its parameters, AdamW's state and the data position."""
    assert_survives(3, "kill:slot=1:step=12", GPT)


def test_ddp_nan_rolls_back_and_skips_its_data_with_the_reference_hash(
        tmp_path):
    """A NaN in slot 1's gradients at step 12 (found by the DDP hook's
    check of its own bucket): the job rolls back, skips the batch, and
    ends with the model of a fault-free run told to skip it."""
    rc, lines = run_job(["-n", "3", "--standby", "1", "--log-dir",
                         str(tmp_path), "--inject", "nan:slot=1:step=12"],
                        DDP)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rollbacks"] == 1, out
    assert summary["skipped_data"] == [[11, 12]], out
    [incident] = summary["incidents"]
    assert incident["kind"] == "numeric" and incident["slot"] == 1, incident
    finals = final_lines(lines)
    rc, ref = run_job(["-n", "3"], DDP + ["--skip-data", "11:12"])
    assert rc == 0, "\n".join(ref[-40:])
    assert len(finals) == 3 and set(finals) == set(final_lines(ref)), out
    assert set(finals) != {fault_free_hash(3)}, out


def test_hostile_connections_to_every_port_leave_the_fault_free_hash(
        tmp_path):
    """Issue 59's fuzzing: while the DDP example runs on 4 slots and a
    standby, and slot 1 is killed at step 15, every port that holdfast-run
    and the processes under it listen on (the controller's; the Gloo pairs'
    and backup links' listeners of each generation being built) takes
    random bytes, HTTP/2's preface and garbage, backup-link and Gloo-link
    hellos with garbage, replayed copies of the job's own handshakes
    recorded on lo, and silent connections (test/support/fuzz.py). The job
    ends with the fault-free hash, and no process but the killed one is
    lost. Before the fresh start after a failed first generation, 2 of 2
    such runs stopped at step 0 (every member left with DataLoss); before
    the Gloo pairs' handshake, a hostile connection took a pair and failed
    its generation, now it is refused and the pair waits for its peer."""
    job = DDP + ["--step-ms", "100"]
    ref = fault_free_hash(4, job)
    fuzzer = PortFuzzer(os.getpid()).start()
    try:
        rc, lines = run_job(["-n", "4", "--standby", "1", "--log-dir",
                             str(tmp_path), "--inject", "kill:slot=1:step=15"],
                            job)
    finally:
        hits = fuzzer.stop()
    # (gRPC logs each refused TLS handshake.)
    out = "\n".join([ln for ln in lines if "ssl_transport_security" not in ln]
                    [-60:]) + (f"\nports hit: {hits}, replays: "
                               f"{fuzzer.replays} ({fuzzer.recorder.error}), "
                               f"{fuzzer.cycles} passes, the slowest "
                               f"{fuzzer.slowest_ms:.0f} ms")
    assert rc == 0, out
    finals = final_lines(lines)
    assert len(finals) == 4 and set(finals) == {ref}, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    kinds = sorted(i["kind"] for i in summary["incidents"])
    # The kill alone: no hostile connection takes a Gloo pair any more.
    assert kinds == ["crashed"], out
    assert fuzzer.connections("controller") > 0, out
    assert fuzzer.connections("member") > 0, out
    # Replays need a packet socket (root, as CI runs).
    if fuzzer.recorder.error is None:
        assert fuzzer.replays > 0, out


def run_one_flip(tmp_path, fault, extra_env=None):
    """Runs the DDP example on 3 ranks and a standby with `fault` on slot 1
    at step 12; asserts that one numeric incident named slot 1, the job
    rolled back once skipping nothing, and every rank ended with the
    fault-free model. Returns the incident's evidence."""
    rc, lines = run_job(["-n", "3", "--standby", "1", "--log-dir",
                         str(tmp_path), "--inject", f"{fault}:slot=1:step=12"],
                        DDP, extra_env=extra_env)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rollbacks"] == 1, out
    assert summary["skipped_data"] == [], out
    [incident] = summary["incidents"]
    assert incident["kind"] == "numeric" and incident["slot"] == 1, incident
    finals = final_lines(lines)
    assert len(finals) == 3 and set(finals) == {fault_free_hash(3)}, out
    return incident["evidence"]


def test_ddp_bit_flipped_at_rest_is_rolled_back_to_the_fault_free_hash(
        tmp_path):
    """A bit of slot 1's registered parameters flips after step 12 (the
    bitflip fault), and replica checks are on: the controller finds slot
    1's state unlike the others', the job rolls back skipping nothing, and
    ends with the fault-free model."""
    evidence = run_one_flip(tmp_path, "bitflip",
                            {"HOLDFAST_REPLICA_CHECK_EVERY": "1"})
    assert "replicated state differs" in evidence, evidence


def test_ddp_bit_flipped_in_gradients_is_named_and_rolled_back(tmp_path):
    """A bit of slot 1's gradient bucket flips before the all-reduce at
    step 12 (the gradflip fault: an exponent bit, the value stays finite).
    Its grad_norm metric is Inf on every rank after the all-reduce; the
    local norms the anomaly reports carry name slot 1, the job rolls back
    skipping nothing, and it ends with the fault-free model."""
    evidence = run_one_flip(tmp_path, "gradflip")
    assert "local gradient norms of step 12: slot 1's" in evidence, evidence


def test_ddp_uneven_steps_raise_no_alarm(tmp_path):
    """An RL-shaped workload (--uneven: lognormal step times, some steps
    5-10x, the same draw on every rank) on 3 ranks: no straggler, no
    stall, nothing."""
    rc, lines = run_job(["-n", "3", "--log-dir", str(tmp_path)],
                        DDP + ["--step-ms", "20", "--uneven", "0.8"])
    assert rc == 0, "\n".join(lines[-40:])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["incidents"] == [], summary["incidents"]
    assert len(set(final_lines(lines))) == 1


def test_ddp_state_whose_every_copy_is_lost_comes_from_live_state():
    """Slot 1 dies in step 20 and its buddy, slot 3 (the same place on the
    other host), as soon as the recovery begins: no copy of slot 1's piece
    of the committed step is left. The survivors' DDP all-reduce failed
    before their fence (begin_state_update() raises the deferred failure),
    so their live state is the last completed step, with one hash: it is
    restored from there, and the run ends with the fault-free hash."""
    expected = fault_free_hash(4)
    rc, lines = run_job(["-n", "4", "--standby", "2", "--hosts", "2",
                         "--inject", "kill:slot=1:step=20",
                         "--inject", "kill:slot=3:recovery=1"], DDP)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    assert any("from the live state of slot" in line for line in lines), out
    finals = final_lines(lines)
    assert len(finals) == 4 and set(finals) == {expected}, out


def test_ddp_shrinks_to_one_rank():
    rc, lines = run_job(
        ["-n", "2", "--mode", "shrink", "--inject", "kill:slot=1:step=10"], DDP)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    finals = final_lines(lines)
    assert len(finals) == 1 and finals[0].startswith("final step=30 world=1 "), out


def test_libtorch_trainer_survives_a_kill_with_the_fault_free_hash():
    trainer = [str(BUILD / "holdfast-torch-trainer"), "--steps", "30"]
    rc, lines = run_job(["-n", "3", "--standby", "1"], trainer)
    clean = final_lines(lines)
    assert rc == 0 and len(clean) == 3 and len(set(clean)) == 1, lines[-30:]
    # Its steps fence their writes (WriteFence) before opt.step().
    assert_fenced(lines, 3)
    rc, lines = run_job(["-n", "3", "--standby", "1", "--inject",
                         "kill:slot=1:step=12"], trainer)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    assert set(final_lines(lines)) == set(clean), out
    assert len(final_lines(lines)) == 3, out
    assert any("recoveries=1" in line for line in lines), out


def test_a_loss_after_the_last_step_is_recovered_not_left_hanging(tmp_path):
    """Slot 0 has done every step when slot 1 dies: it must take part in the
    new generation (the standby needs it) instead of leaving as finished."""
    rc, lines = run_job(
        ["-n", "2", "--standby", "1"],
        [PYTHON, str(HERE / "late_death_job.py"), "12", str(tmp_path / "fired")],
        timeout=120)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    assert (tmp_path / "fired").exists()
    # 12 steps of (1 + 2) * step on a world of 2: 3 * 78 per element.
    assert sorted(final_lines(lines)) == ["final step=12 world=2 sum=936.0"] * 2, out
    # Slot 0's record of the recovery (RecoveryRecord's times), though no
    # step came after it (first_step_ms 0): the stages in order, and the
    # training communicator up with the rebuild (on Gloo, built beside
    # the side one, before the restore).
    records = [m for line in lines for m in [re.search(
        r"^\[slot 0\] recovery generation=1 stages_ms=([\d,]+) "
        r"comm_up_ms=(\d+)", line)] if m]
    assert len(records) == 1, out
    stages = [int(t) for t in records[0].group(1).split(",")]
    assert stages[0] > 0 and stages[:5] == sorted(stages[:5]), stages
    assert stages[5] == 0, stages
    assert stages[2] <= int(records[0].group(2)) <= stages[3], records[0][0]


def _standby_pids(lines):
    """The pids in the standby's log lines ("[standby] ... holdfast[PID]")."""
    return {int(m.group(1)) for line in lines if line.startswith("[standby]")
            for m in [re.search(r"holdfast\[(\d+)\]", line)] if m}


def test_the_standby_alone_runs_the_trainers_warmup_once_before_it_waits():
    """run(standby_warmup=...) in the DDP example: the standby runs it once,
    before it waits for a slot, and nobody else does; after slot 1's kill it
    takes the slot, and the job ends with the fault-free hash."""
    expected = fault_free_hash(3, DDP)
    rc, lines = run_job(["-n", "3", "--standby", "1", "--inject",
                         "kill:slot=1:step=9"], DDP,
                        extra_env={"HOLDFAST_LOG_LEVEL": "info"})
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    assert set(final_lines(lines)) == {expected}, out
    assert len(final_lines(lines)) == 3, out
    took = [i for i, line in enumerate(lines)
            if "the trainer's warm-up took" in line]
    waiting = [i for i, line in enumerate(lines)
               if "standby, waiting for a slot" in line]
    assert len(took) == 1 and lines[took[0]].startswith("[standby]"), out
    assert len(waiting) == 1 and took[0] < waiting[0], out


def test_a_standby_warmup_that_raises_is_logged_and_the_standby_serves(
        tmp_path):
    calls = tmp_path / "calls"
    rc, lines = run_job(
        ["-n", "3", "--standby", "1", "--inject", "kill:slot=2:step=6"],
        [PYTHON, str(HERE / "warmup_job.py"), "10", str(calls), "raise"],
        timeout=120)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    pids = [int(p) for p in calls.read_text().split()]
    assert len(pids) == 1 and {pids[0]} == _standby_pids(lines), out
    failed = [line for line in lines if "warm-up failed" in line]
    assert len(failed) == 1 and "warm-up broke on purpose" in failed[0], out
    # 10 steps of (1 + 2 + 3) * step on a world of 3, the standby in slot 2.
    assert sorted(final_lines(lines)) == ["final step=10 world=3 sum=1320.0"] * 3, out


def test_a_group_op_issued_after_the_next_generation_opened_fails_the_step():
    """A torch.distributed op issued in a step after the controller opened
    the next generation (slot 1 was killed as the step began; a DDP hook
    late in backward does this) fails, and the step is redone after a
    recovery: the group does not build the new generation's communicator
    in the middle of the step, where the standby is still restoring."""
    steps, kill_step = 8, 5
    rc, lines = run_job(
        ["-n", "3", "--standby", "1", "--inject", f"kill:slot=1:step={kill_step}"],
        [PYTHON, str(HERE / "stale_group_job.py"), str(steps), str(kill_step)],
        timeout=120)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    # Each step adds step * (1 + 2 + 3) to each of 4 elements.
    want = 4 * 6 * steps * (steps + 1) // 2
    assert sorted(final_lines(lines)) == [
        f"final step={steps} world=3 sum={float(want)}"] * 3, out


def run_verdict_job(tmp_path, mode, args=()):
    """verdict_job.py MODE on 3 slots for 6 steps; (exit code, summary.json,
    the output's tail)."""
    log = tmp_path / "log"
    rc, lines = run_job(["-n", "3", "--log-dir", str(log), *args],
                        [PYTHON, str(HERE / "verdict_job.py"), "6", mode],
                        timeout=120)
    return rc, json.loads((log / "summary.json").read_text()), \
        "\n".join(lines[-40:])


def test_a_worker_that_exits_non_zero_after_training_fails_the_launch(tmp_path):
    rc, summary, out = run_verdict_job(tmp_path, "worker_exit")
    assert summary["outcome"] == "finished", out
    assert rc == 4 and summary["exit_code"] == 4, out
    assert [p["exit_code"] for p in summary["problems"]] == [4], out
    assert "finished training, then exited with code 1" in \
        summary["problems"][0]["problem"], out


def test_replicas_that_differ_at_the_end_fail_the_launch(tmp_path):
    """One bit of slot 2's replicated state is flipped from another
    process (/proc/<pid>/mem) in the last step."""
    rc, summary, out = run_verdict_job(tmp_path, "flip")
    assert summary["outcome"] == "finished", out
    assert summary["replicas_agree"] is False, out
    assert rc == 5 and summary["exit_code"] == 5, out
    assert "replicated state differs" in summary["problems"][0]["problem"], out


def test_a_standby_that_takes_a_slot_and_fails_fails_the_launch(tmp_path):
    rc, summary, out = run_verdict_job(
        tmp_path, "standby_fail",
        ["--standby", "1", "--inject", "kill:slot=1:step=3"])
    assert summary["outcome"] == "finished", out
    assert rc == 6 and summary["exit_code"] == 6, out
    assert any("was a standby, took a slot and failed" in p["problem"]
               for p in summary["problems"]), out


def test_a_clean_job_exits_0_with_no_problems(tmp_path):
    rc, summary, out = run_verdict_job(tmp_path, "clean")
    assert rc == 0 and summary["exit_code"] == 0, out
    assert summary["problems"] == [] and summary["replicas_agree"], out


def run_stopping_job(log, args, job, extra_env=None, job_args=()):
    """Runs `job` (a script here) under holdfast-run with --log-dir `log`,
    for a failure no recovery mends: the job must stop, non-zero, with no
    final line. Returns (output lines, summary.json, the output's tail)."""
    rc, lines = run_job(args + ["--log-dir", str(log)],
                        [PYTHON, str(HERE / job), *job_args],
                        extra_env=extra_env, timeout=120)
    out = "\n".join(lines[-60:])
    assert rc == 3, out  # stopped (tools/launcher.h)
    assert final_lines(lines) == [], out
    summary = json.loads((log / "summary.json").read_text())
    assert summary["outcome"] == "stopped", out
    return lines, summary, out


def test_a_collective_mismatch_ends_the_job_with_an_error_naming_it(tmp_path):
    """A collective mismatch is a program error that every recovery would
    redo (the same steps run again): instead of recovering from it again and
    again, every member (the standby that takes a slot too) stops with an
    error that names both collectives, and the job stops."""
    log = tmp_path / "log"
    lines, summary, out = run_stopping_job(
        log, ["-n", "2", "--standby", "1"], "mismatch_job.py",
        extra_env={"HOLDFAST_TIMEOUT_MS": "2000"})
    # No slot finished: the launcher says so rather than "steps: 0".
    assert any(line.startswith("steps: no slot finished (committed step ")
               for line in lines), out
    assert summary["error"]["code"] == "INVALID_ARGUMENT", out
    message = summary["error"]["message"]
    # Numbered among all the collectives, the runtime's own included.
    assert re.search(r"collective mismatch at collective #\d+ of generation 0",
                     message), message
    assert "rank 0 issued AllReduce (4 x float64, sum)" in message
    assert "rank 1 issued AllReduce (8 x float64, sum)" in message
    # Both workers stop on it, whichever of them found it.
    errors = [line for line in lines
              if "] error: InvalidArgumentError INVALID_ARGUMENT: collective "
                 "mismatch" in line]
    assert len(errors) == 2, out
    # At most the standby's one recovery: no generation after generation.
    assert len(summary["recoveries"]) <= 1, out
    # The evidence: each worker's trace ring, written when its
    # communicator aborted.
    assert len(list((log / "trace").glob("trace-g0-r*.json"))) >= 2, out


def test_a_send_recv_mismatch_ends_the_job_with_an_error_naming_it(tmp_path):
    """The same for a Send and the Recv it matches with another size: the
    job stops with an error that names both sizes instead of recovering.
    (Steps count from 1: step 3's message is the third, #2.)"""
    log = tmp_path / "log"
    lines, summary, out = run_stopping_job(
        log, ["-n", "2"], "mismatch_job.py",
        extra_env={"HOLDFAST_TIMEOUT_MS": "2000"}, job_args=["p2p"])
    assert summary["error"]["code"] == "INVALID_ARGUMENT", out
    message = summary["error"]["message"]
    assert ("point-to-point mismatch at message #2 from rank 0 to rank 1 "
            "(tag 3) of generation 0") in message, out
    assert "rank 0 sends 4 x float64" in message, out
    assert "rank 1 receives 8 x float64" in message, out
    errors = [line for line in lines
              if "] error: InvalidArgumentError INVALID_ARGUMENT: "
                 "point-to-point mismatch" in line]
    assert len(errors) == 2, out
    assert summary["recoveries"] == [], out


def test_a_failure_that_repeats_at_every_retry_ends_the_run(tmp_path):
    """A step that fails again each time it is redone (here an op timeout
    too short for it) is retried max_step_retries (2) times, then every
    member stops with the failure and a message saying it repeats, instead
    of recovering forever."""
    lines, _, out = run_stopping_job(tmp_path / "log", ["-n", "2"],
                                     "repeat_timeout_job.py")
    gave_up = [line for line in lines
               if "] error: " in line and "no step after step 2 completed in "
               "2 recoveries in a row (HOLDFAST_MAX_STEP_RETRIES)" in line]
    assert len(gave_up) == 2, out
    # Slot 0 timed out; slot 1 found the group aborted.
    assert any("TimeoutError" in line and "timed out after 200ms" in line
               for line in gave_up), out
    # Two recoveries by each member, then the stop.
    assert sum("recovered at generation" in line for line in lines) == 4, out


CGROUP_CPU = pathlib.Path("/sys/fs/cgroup/cpu")


def _capture_slot(log_dir, slot, group, stop, moved):
    """Once slot `slot`'s worker has done a few steps (members.json in
    holdfast-run's `log_dir`), moves its process into cgroup `group`."""
    while not stop.is_set():
        pid = worker_pid(log_dir, slot, 3)
        if pid is not None:
            (group / "cgroup.procs").write_text(str(pid))
            moved.append(pid)
            return
        time.sleep(0.01)


@pytest.mark.skipif(not os.access(CGROUP_CPU / "cgroup.procs", os.W_OK),
                    reason="needs root and the cgroup v1 cpu controller")
def test_ddp_rank_capped_by_a_cpu_quota_is_reported_a_straggler(tmp_path):
    """Issue 56's measurement: one rank of the 4-rank DDP example capped at
    25 % of a core (cpu.cfs_quota_us) slowed the job about 2x and raised
    no incident. It is reported a straggler now, nobody is fenced, and the
    job ends with the hash of the same job without the cap."""
    job = [PYTHON, str(HERE.parent.parent / "examples/python/ddp_train.py"),
           "--steps", "1000"]
    rc, lines = run_job(["-n", "4"], job)
    assert rc == 0, "\n".join(lines[-40:])
    reference = final_lines(lines)
    assert len(reference) == 4 and len(set(reference)) == 1, reference

    group = CGROUP_CPU / f"holdfast-pytest-{os.getpid()}"
    group.mkdir()
    moved, stop = [], threading.Event()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("25000")
        log_dir = tmp_path / "hf"
        mover = threading.Thread(target=_capture_slot,
                                 args=(log_dir, 1, group, stop, moved))
        mover.start()
        rc, lines = run_job(["-n", "4", "--log-dir", str(log_dir)], job)
    finally:
        stop.set()
        mover.join()
        for pid in moved:  # back to the root group if it still runs
            try:
                (CGROUP_CPU / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        group.rmdir()
    out = "\n".join(lines[-40:])
    assert moved, out
    assert rc == 0, out
    assert final_lines(lines) == reference, out
    summary = json.loads((log_dir / "summary.json").read_text())
    incidents = summary["incidents"]
    assert [(i["kind"], i["slot"], i["evicted"]) for i in incidents] == [
        ("straggler", 1, False)], out
