"""PyTorch on CUDA over NCCL, 3 ranks on one GPU (test/python/gpu_rank.sh
gives each its own NCCL host id): the "holdfast" group's collectives on
CUDA tensors with ProcessGroupNCCL's stream semantics, and DDP and FSDP2
on CUDA ending with the fault-free hash after a SIGKILL and a SIGSTOP,
and the GPT example on CUDA through a SIGKILL.
Skipped (exit 77 under CTest) without a CUDA device."""

import signal

import pytest
import torch

from conftest import (DDP, FSDP, GPT, HERE, PYTHON, assert_survives,
                      final_lines, run_job)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device")

RANK = [str(HERE / "gpu_rank.sh")]
GPU_ENV = {"HOLDFAST_BACKEND": "nccl", "HOLDFAST_DEVICE": "0"}
DDP_CUDA = RANK + DDP + ["--device", "cuda"]
FSDP_CUDA = RANK + FSDP + ["--device", "cuda"]
GPT_CUDA = RANK + GPT[:GPT.index("--device")] + ["--device", "cuda"]


def test_collectives_on_cuda_tensors():
    rc, lines = run_job(["-n", "3"],
                        RANK + [PYTHON, str(HERE / "cuda_collectives_job.py")],
                        extra_env=GPU_ENV)
    out = "\n".join(lines[-60:])
    oks = sorted(line.split("] ", 1)[1] for line in lines if "] ok rank=" in line)
    assert rc == 0, out
    assert oks == [f"ok rank={r}" for r in range(3)], out
    print("\n".join(line for line in lines if "position-dependent" in line))


def test_every_call_on_cuda_gives_the_answer_gloo_gives():
    """conformance_job.py with the holdfast group's calls on CUDA tensors
    (gloo's answers from the CPU)."""
    from test_conformance import check_conformance

    rc, lines = run_job(["-n", "3"],
                        RANK + [PYTHON, str(HERE / "conformance_job.py")],
                        extra_env=dict(GPU_ENV,
                                       HOLDFAST_CONFORMANCE_DEVICE="cuda",
                                       HOLDFAST_TIMEOUT_MS="15000"),
                        timeout=180)
    check_conformance(rc, lines, 3)


@pytest.mark.parametrize("fault", [
    "kill:slot=1:step=9", "kill:slot=0:step=17", "hang:slot=2:step=12"])
def test_ddp_on_cuda_survives_a_fault_with_the_fault_free_hash(fault):
    assert_survives(3, fault, DDP_CUDA, extra_env=GPU_ENV)


@pytest.mark.parametrize("warmup", ["on", "off"])
def test_ddp_on_cuda_recovers_with_and_without_the_standby_warmup(warmup):
    """An A/B of run's standby_warmup (the DDP example's --standby-warmup),
    with info logs: the warm-up's time and every member's first step after
    the restore are in the job's log (HOLDFAST_TEST_JOB_LOG_DIR). The
    fault-free hash both ways."""
    assert_survives(3, "kill:slot=1:step=9",
                    DDP_CUDA + ["--standby-warmup", warmup],
                    extra_env=dict(GPU_ENV, HOLDFAST_LOG_LEVEL="info"))


@pytest.mark.parametrize("fault", ["kill:slot=1:step=9", "hang:slot=0:step=14"])
def test_fsdp2_on_cuda_survives_a_fault_with_the_fault_free_hash(fault):
    assert_survives(3, fault, FSDP_CUDA, extra_env=GPU_ENV)


# Sent from outside, by pid, while the rank is anywhere in its step (30 ms
# of it a sleep): (slot, step, signal).
@pytest.mark.parametrize("job,fault", [
    (DDP_CUDA, (1, 8, signal.SIGSTOP)), (FSDP_CUDA, (2, 10, signal.SIGKILL)),
    (FSDP_CUDA, (0, 10, signal.SIGSTOP))], ids=["ddp-stop", "fsdp2-kill",
                                                "fsdp2-stop"])
def test_cuda_jobs_survive_a_signal_from_outside_with_the_fault_free_hash(
        job, fault):
    assert_survives(3, fault, job + ["--step-ms", "30"], extra_env=GPU_ENV)


def test_gpt_on_cuda_survives_a_kill_with_the_fault_free_hash():
    """examples/python/gpt_train.py (DDP, AdamW) on CUDA: the README's
    example."""
    assert_survives(3, "kill:slot=1:step=12", GPT_CUDA, extra_env=GPU_ENV)


def test_gpt_fsdp2_on_cuda_survives_a_kill_with_the_fault_free_hash():
    """gpt_train.py --parallel fsdp2 on CUDA: FSDP's device shards copied
    to the registered host partitions after each step and back after a
    restore."""
    assert_survives(3, "kill:slot=1:step=12", GPT_CUDA + ["--parallel", "fsdp2"],
                    extra_env=GPU_ENV)


def test_ddp_on_cuda_shrinks_from_3_to_2():
    rc, lines = run_job(
        ["-n", "3", "--mode", "shrink", "--inject", "kill:slot=2:step=10"],
        DDP_CUDA, extra_env=GPU_ENV)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    finals = final_lines(lines)
    assert len(finals) == 2 and len(set(finals)) == 1, out
    assert finals[0].startswith("final step=30 world=2 "), out

