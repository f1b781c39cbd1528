"""torch 2.x on holdfast beyond DDP: FSDP2 (fully_shard) with its shards
registered as sharded state, and torch.distributed.checkpoint (DCP)
checkpoints written by a job, read by plain torch and starting a job, all
under real faults (SIGKILL, SIGSTOP) on 3 and 4 ranks, ending with the
fault-free parameter hash."""

import subprocess

import pytest

from conftest import (DDP, FSDP, GPT, HERE, PP_DDP, PYTHON, assert_survives,
                      fault_free_hash, final_lines, run_job)


# FSDP2 (fully_shard) over the holdfast group: each slot's shards are
# sharded state, so the standby that takes the lost slot gets its shards
# from buddies (the hash would show a shard it lacked). (A kill of slot 0
# at step 22 and a hang on 4 ranks added 65 s to CI and nothing these and
# the two FSDP2 kills below do not check.)
@pytest.mark.parametrize("ranks,fault", [
    (3, "kill:slot=1:step=13"), (3, "hang:slot=2:step=9"),
    (4, "kill:slot=3:step=17"),
])
def test_fsdp2_survives_a_fault_with_the_fault_free_hash(ranks, fault):
    assert_survives(ranks, fault, FSDP)


def test_fsdp2_trains_on_the_registered_partitions_through_a_kill():
    """One copy of the shards: every step, each of FSDP's parameter shards
    and SGD's momentum shards (6 parameters, 12 shards) is a view of its
    registered partition, on the survivors and on the standby that took
    the lost slot, and the run ends with the fault-free hash."""
    expected = fault_free_hash(3, FSDP)
    rc, lines = run_job(["-n", "3", "--standby", "1", "--inject",
                         "kill:slot=2:step=14"], FSDP)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    assert set(final_lines(lines)) == {expected}, out
    assert sum("] shards_in_place=12" in line for line in lines) == 3, out


def test_gpt_fsdp2_trains_on_its_registered_partitions_through_a_kill():
    """The GPT example with --parallel fsdp2 (fully_shard on each block
    and the model, AdamW): a SIGKILL of slot 1 at step 12 ends with the
    fault-free hash of the full parameters, both moments, the step counts
    and the data position, and every step trained on the registered
    partitions (53 parameters: 159 shards, one copy each)."""
    job = GPT + ["--parallel", "fsdp2"]
    expected = fault_free_hash(3, job)
    rc, lines = run_job(["-n", "3", "--standby", "1", "--inject",
                         "kill:slot=1:step=12"], job)
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    assert len(final_lines(lines)) == 3, out
    assert set(final_lines(lines)) == {expected}, out
    assert sum("] shards_in_place=159" in line for line in lines) == 3, out


# Two dimensions: pipeline stages x DDP replicas on a 2 x 2 device mesh of
# holdfast subgroups. The standby that takes a slot takes its stage and its
# replica's place in both groups; the hash covers every slot's state.
@pytest.mark.parametrize("fault", ["kill:slot=1:step=12", "hang:slot=2:step=9"])
def test_pipeline_x_ddp_on_a_2x2_mesh_survives_a_fault_with_the_fault_free_hash(
        fault):
    assert_survives(4, fault, PP_DDP)


def test_fsdp2_without_a_standby_stops_with_an_error_naming_the_shrink():
    rc, lines = run_job(["-n", "3", "--inject", "kill:slot=1:step=5"], FSDP)
    out = "\n".join(lines[-60:])
    assert rc != 0, out
    assert "the world shrank from 3 to 2 slots" in out, out
    assert "run it with standbys" in out, out


def test_ddp_dcp_checkpoints_load_in_plain_torch_and_start_a_job(tmp_path):
    """torch.distributed.checkpoint both ways, on 3 ranks: the DDP example
    writes one every 10 steps through a kill; plain torch loads the last
    one's model with the job's final hash; and a fresh job started from
    step 20's (as written, and as plain torch wrote it again, with a kill
    at step 25) ends with the fault-free hash."""
    expected = fault_free_hash(3)
    final = expected.split("params_sha256=")[1]
    root = tmp_path / "dcp"
    rc, lines = run_job(
        ["-n", "3", "--standby", "1", "--inject", "kill:slot=1:step=15"],
        DDP + ["--dcp-dir", str(root), "--dcp-every", "10"])
    out = "\n".join(lines[-60:])
    assert rc == 0, out
    assert set(final_lines(lines)) == {expected}, out
    assert sorted(p.name for p in root.iterdir()) == [
        "step-10", "step-20", "step-30"]

    def plain(*args):
        p = subprocess.run([PYTHON, str(HERE / "dcp_plain_load.py")]
                           + [str(a) for a in args],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().splitlines()[-1]

    assert plain(root / "step-30") == f"plain step=30 params_sha256={final}"
    resaved = tmp_path / "resaved-20"
    assert plain(root / "step-20", "--resave", resaved).startswith("resaved ")
    for start, fault in ((root / "step-20", []),
                         (resaved, ["--inject", "kill:slot=2:step=25"])):
        rc, lines = run_job(["-n", "3", "--standby", "1"] + fault,
                            DDP + ["--from-dcp", str(start)])
        out = "\n".join(lines[-60:])
        assert rc == 0, out
        assert set(final_lines(lines)) == {expected}, out
        assert len(final_lines(lines)) == 3, out
