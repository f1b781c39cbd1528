"""torch.distributed's whole collective API on the holdfast group, against
gloo's answers in the same job (conformance_job.py), on 3 and 4 ranks."""

import pytest

from conftest import HERE, PYTHON, run_job

# Calls holdfast refuses where gloo answers, each with its reason (the
# table in docs/python.md).
UNSUPPORTED = {
    # torch runs it for its gloo backend only.
    "monitored_barrier": "monitored_barrier is only implemented for GLOO",
    # Every receive names its source.
    "irecv from any source": "a receive from any source",
}


@pytest.mark.parametrize("ranks", [3, 4])
def test_every_call_gives_the_answer_gloo_gives(ranks):
    rc, lines = run_job(["-n", str(ranks)],
                        [PYTHON, str(HERE / "conformance_job.py")])
    check_conformance(rc, lines, ranks)


def check_conformance(rc, lines, ranks):
    """Every rank compared every case, none gave a wrong answer, and the
    calls refused are exactly UNSUPPORTED's."""
    assert rc == 0, "\n".join(lines[-60:])
    cases = [line.split("] ", 1)[1] for line in lines if "] case " in line]
    summaries = sorted(line.split("] ", 1)[1] for line in lines
                       if "] conformance rank=" in line)
    assert [s.split(" cases=")[0] for s in summaries] == [
        f"conformance rank={r}" for r in range(ranks)], summaries
    assert all(s.endswith(" mismatches=0") for s in summaries), (
        [c for c in cases if "MISMATCH" in c] or summaries)
    assert not [c for c in cases if "MISMATCH" in c]
    unsupported = {}
    for c in cases:
        name, sep, why = c[len("case "):].partition(" unsupported: ")
        if sep:
            unsupported[name] = why
    assert sorted(unsupported) == sorted(UNSUPPORTED), unsupported
    for name, why in UNSUPPORTED.items():
        assert why in unsupported[name], (name, unsupported[name])
    # The calls below are answered (not refused) on the holdfast group.
    answered = {c[len("case "):].split(" ok")[0] for c in cases
                if " ok" in c and "unsupported" not in c}
    for name in ("reduce", "gather", "scatter", "all_to_all_single uneven",
                 "all_to_all", "all_reduce_coalesced",
                 "batch_isend_irecv, a ring both ways",
                 "new_group all the rest", "split_group",
                 "all_reduce sum int8", "all_reduce max bool"):
        assert name in answered, (name, sorted(answered))
    if ranks >= 4:
        assert "init_device_mesh 2-D" in answered
