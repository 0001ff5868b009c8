"""Segment-by-segment evaluation gives the same views and verdicts as one fixpoint."""
import pytest

from conftest import example_targets
from dlverify.api import verify_problem
from dlverify.cases import load_cases
from dlverify.frontends.jaxpr import import_jax
from dlverify.segments import needs_segments

TARGETS = example_targets()


@pytest.mark.parametrize("path,name", TARGETS, ids=[n for _, n in TARGETS])
def test_tiny_windows_match_one_fixpoint(path, name):
    c = dict(load_cases(path, name))[name]()
    whole = verify_problem(import_jax(c.seq, c.dist, c.args, name), engine="clingo", window=10**6)
    problem = import_jax(c.seq, c.dist, c.args, name)
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
