"""Segment-by-segment evaluation gives the same views and verdicts as one fixpoint."""
import pytest

from conftest import representative_targets
from dlverify.api import DEFAULT_WINDOW, jax_problem, verify_problem
from dlverify.segments import needs_segments

# The tiny-window comparison runs on a correct case and a buggy twin of every
# example file and on the TP=2 SP models' forward (see
# conftest.representative_targets). The training steps are left out here: with
# 12-op windows they cost a minute of the CI budget, and their backward passes are
# cut into segments at the default window below (train=True) and by every
# training case of tests/test_models.py.
TARGETS = [(p, n) for p, n in representative_targets()
           if not (p.parent.name == "models" and n.endswith("_train"))]


@pytest.mark.parametrize("path,name", TARGETS, ids=[n for _, n in TARGETS])
def test_tiny_windows_match_one_fixpoint(path, name, example_runs):
    c = example_runs.case(path, name)
    problem, _ = jax_problem(c.seq, c.dist, *c.args, name=name)   # shard_map or jit (compiled)
    if needs_segments(problem, DEFAULT_WINDOW):
        whole = verify_problem(jax_problem(c.seq, c.dist, *c.args, name=name)[0], engine="clingo",
                               window=10**6)
    else:  # the session's run of this case was already one fixpoint
        whole = example_runs.run(path, name).result
    seg = verify_problem(problem, engine="clingo", window=12)
    # Judged on the problem as evaluated (verify_problem's passes share constants).
    segmented = needs_segments(problem, 12)
    assert segmented == any("segments" in n for n in seg.notes)
    assert seg.verified == whole.verified
    # Segments do not carry views of tensors nobody reads any more, so they derive
    # a subset of the views (ids are assigned identically by the two imports).
    assert set(seg.views) <= set(whole.views)
    assert seg.outputs == whole.outputs
    assert [(f.op, f.line) for f in seg.failures] == [(f.op, f.line) for f in whole.failures]


@pytest.mark.parametrize("dtype,train", [("float32", False), ("bfloat16", False),
                                         ("float16", False), ("float32", True)])
def test_layers_are_segments_and_repeat_without_a_retry(dtype, train):
    """Six Llama layers (TP=2 + SP): the forward, and the backward of a training step,
    are cut at layer boundaries; the segments of equal layers are memo hits; the
    segments alone prove every output (no retry as one fixpoint)."""
    import sys

    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "examples" / "models"))
    import llama3

    cfg = llama3.SMALL._replace(layers=6, dtype=dtype)
    c = llama3.make_case(2, sp=True, train=train, cfg=cfg)
    res = verify_problem(jax_problem(c.seq, c.dist, *c.args, name="llama6")[0], engine="clingo")
    assert res.verified, res.failures[:2]
    assert not any("one fixpoint" in n for n in res.notes)
    plan = res.segment_plan
    assert len(plan.dist_blocks) == (2 if train else 1)  # forward (and backward) layers
    assert all(r.count >= 4 for r in plan.dist_blocks + plan.seq_blocks)
    assert plan.memo_hits >= 3 * len(plan.dist_blocks)
