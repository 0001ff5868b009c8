"""update.dl, two dims: a dynamic_update_slice into zeros whose update is one
index along one dim and part of another (the gradient of a per-rank
dynamic_slice of some query heads of one KV group, as Llama ranks take when KV
heads are fewer than ranks).

Every view a tiny program derives is checked numerically (rulekit: the ranks'
partial terms that tile a family must sum to the sequential block); the JAX
program has a buggy twin that must not verify, with its first failure at the
`# BUG` line."""
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from jax.sharding import Mesh as JMesh, PartitionSpec as P
from rulekit import Tiny

from dlverify.api import verify_jax, verify_problem
from dlverify.engine import souffle_runner
from dlverify.ir import Mesh
from dlverify.partial_tags import MASK2_BASE, MASK_BASE, PAIR, full_size
from dlverify.verdict import Partial

GROUPS, HEADS, DIM = 2, 4, 3      # the sequential tensor: (group, head, feature)
SHAPE = (GROUPS, HEADS, DIM)


def _int(b, value):
    return b.constant(np.asarray(value, dtype=np.int32), (), "int32")


def _starts(t, group_of, head_of):
    """Rank r's start (group_of(r), head_of(r), 0) as int ops of axis_index: group_of and
    head_of are (divisor, multiplier) pairs: r // d * m and r % d * m."""
    r = t.D.op("axis_index", [], (), "int32", {"axis": "x"})

    def part(op, d, m):
        q = t.D.op(op, [r, _int(t.D, d)], (), "int32")
        return t.D.op("mul", [q, _int(t.D, m)], (), "int32")
    return [part("div", *group_of), part("rem", *head_of), _int(t.D, 0)]


def _cells(t, group_of=(2, 1), head_of=(2, 2), write_at=None, ranks=4):
    """Sequential s = neg(x); on each rank the block (1, 2, DIM) of x at its start, negated
    and written back into zeros at `write_at` (default: where it was read), then psummed."""
    xs, xd = t.input(SHAPE)
    s = t.sop("neg", [xs], SHAPE)
    read = _starts(t, group_of, head_of)
    u = t.dop("dynamic_slice", [xd, *read], (1, 2, DIM), slice_sizes=(1, 2, DIM))
    y = t.dop("neg", [u], (1, 2, DIM))
    z = t.D.constant(np.zeros(SHAPE, dtype=np.float32), SHAPE, "float32")
    ud = t.dop("dynamic_update_slice", [z, y, *(write_at(t) if write_at else read)], SHAPE)
    total = t.dop("all_reduce", [ud], SHAPE, reducer="sum", groups=[list(range(ranks))])
    t.output(s, total)
    return s, ud, total


def test_cells_are_a_two_dim_masked_family_that_psum_completes():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    s, ud, total = _cells(t)
    out = t.run()
    neg = t.seq.ops[-1].id
    axis = MASK2_BASE + PAIR * 0 + 1          # one group (dim 0) outer, heads (dim 1) inner
    assert full_size(t.seq, neg, axis) == GROUPS * HEADS
    for r in range(4):
        lo = (r // 2) * HEADS + (r % 2) * 2
        assert {(v.offsets, v.partial) for v in out.views(s, ud, r)} == {
            ((0, 0, 0), Partial(0, neg, axis, lo, lo + 2))}
        # complete; also the whole range of the heads' mask family, every group's row of
        # cells covering all heads (rect_ranges.dl)
        assert {(v.offsets, v.partial) for v in out.views(s, total, r)} == {
            ((0, 0, 0), None), ((0, 0, 0), Partial(0, neg, MASK_BASE + 1, 0, HEADS))}
    assert out.result.verified


def test_cells_written_where_they_were_not_read_have_no_view():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    # read at (r // 2, r % 2 * 2), written at the other group: the terms are misplaced
    s, ud, total = _cells(t, write_at=lambda t: [
        t.D.op("sub", [_int(t.D, 1), _starts(t, (2, 1), (2, 2))[0]], (), "int32"),
        *_starts(t, (2, 1), (2, 2))[1:]])
    out = t.run()
    assert out.views(s, ud) == [] and out.views(s, total) == []
    assert not out.result.verified


def test_cells_that_do_not_tile_the_family_are_not_completed():
    t = Tiny(mesh=Mesh(("x",), (4,)))
    # every rank reads heads 0..1 of its group: ranks 2g and 2g+1 hold the same cells
    s, ud, total = _cells(t, head_of=(2, 0))
    out = t.run()
    # the two writers of a cell add their updates first (dlverify/cell_groups.py): the
    # cell twice, written where it was read; the second level then misses heads 2..3
    (upd,) = [op.output for op in out.problem.dist.ops if op.kind == "dynamic_update_slice"]
    assert {(v.partial.lo, v.scale) for v in out.views(s, upd)} == {(0, (1, 0, 0, 0)),
                                                                    (HEADS, (1, 0, 0, 0))}
    # twice heads 0..1 of every group: a range of the heads' mask family, never complete
    assert {(v.partial, v.scale) for v in out.views(s, total)} == {
        (Partial(0, t.seq.ops[-1].id, MASK_BASE + 1, 0, 2), (1, 0, 0, 0))}
    assert not out.result.verified


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH "
                    "(../shared/tools/souffle/setup.sh, then put its bin/ on PATH)")
def test_souffle_derives_the_same_cells(monkeypatch):
    monkeypatch.setenv(souffle_runner.MODE_ENV, "interpreted")   # one tiny program: no compile
    t = Tiny(mesh=Mesh(("x",), (4,)))
    _cells(t)
    by_engine = {e: verify_problem(t.problem(), engine=e) for e in ("clingo", "souffle")}
    assert by_engine["souffle"].verified and by_engine["clingo"].verified
    assert set(by_engine["souffle"].views) == set(by_engine["clingo"].views)


# ---------------------------------------------------------------- JAX: the gradient

def _mesh():
    return JMesh(np.array(jax.devices()[:4]).reshape(2, 2), ("kv", "q"))


def _grad_seq(w, g):
    """The gradient of sum(w * g) over all cells: g."""
    return jax.grad(lambda w: jnp.sum(w * g))(w)


def _grad_local(w, g):
    """Rank (a, b) reads heads [2b, 2b + 2) of group a of a replicated weight and multiplies
    them by its block of g: the gradient is its cells in zeros, psummed over all ranks (the
    transpose of using the replicated w on every rank: JAX inserts the psum)."""
    a, b = jax.lax.axis_index("kv"), jax.lax.axis_index("q")

    def f(w):
        cell = jax.lax.dynamic_slice(w, (a, b * 2, 0), (1, 2, DIM))
        return jnp.sum(cell * g)
    return jax.grad(f)(w)


def _grad_local_bug(w, g):
    a, b = jax.lax.axis_index("kv"), jax.lax.axis_index("q")

    def f(w):
        cell = jax.lax.dynamic_slice(w, (a, b, 0), (1, 2, DIM))   # BUG: the ranks' heads overlap
        return jnp.sum(cell * g)
    return jax.grad(f)(w)


def _jit(local):
    return jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("kv", "q")), out_specs=P()))


ARGS = (jax.ShapeDtypeStruct(SHAPE, jnp.float32), jax.ShapeDtypeStruct(SHAPE, jnp.float32))


def _max_diff(local):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(a.shape).astype(np.float32) for a in ARGS]
    return float(np.max(np.abs(np.asarray(_grad_seq(*xs)) - np.asarray(_jit(local)(*xs)))))


def test_gradient_of_a_per_rank_two_dim_dynamic_slice_verifies():
    assert _max_diff(_grad_local) < 1e-5
    res = verify_jax(_grad_seq, _jit(_grad_local), *ARGS, engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:3]]


def test_overlapping_cells_twin_is_not_verified_and_is_located():
    assert _max_diff(_grad_local_bug) > 1e-3   # really buggy
    res = verify_jax(_grad_seq, _jit(_grad_local_bug), *ARGS, engine="clingo")
    assert not res.verified
    lines = {fr.line for f in res.failures[:1] for fr in f.frames}
    assert bug_line(_grad_local_bug) in lines, [(f.op, f.line, f.message) for f in res.failures[:3]]
