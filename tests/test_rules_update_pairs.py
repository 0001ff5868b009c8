"""update_pairs.dl: a dynamic_update_slice written at the same rows on both sides (a
scan's stacked per-layer outputs, unrolled: row i of the stack written at literal i),
the distributed starts computed as a compiled loop computes them.

Every view a tiny program derives is checked numerically (rulekit), on clingo and on
Soufflé; a distributed stack written at other rows, or from another value, is not
related."""
import shutil

import numpy as np
import pytest
from rulekit import Tiny, assert_engines_agree

from dlverify.ir import Mesh

LAYERS, ROWS, COLS = 3, 4, 6          # the stack: (layer, row, feature), features split


def _int(b, value):
    return b.constant(np.asarray(value, dtype=np.int32), (), "int32")


def _counted(b, value):
    """The int32 `value` as the distributed program computes it: rank * 0 + 1 + ... + 1
    (the same on every rank and known before run time, but no constant of the
    sequential program)."""
    rank = b.op("axis_index", [], (), "int32", {"axis": "x"})
    t = b.op("mul", [rank, _int(b, 0)], (), "int32")
    for _ in range(value):
        t = b.op("add", [t, _int(b, 1)], (), "int32")
    return t


def _stack(t, kinds=("neg", "exp"), at=(0, 1), dist_at=None, dist_kinds=None):
    """Sequential: zeros (LAYERS, ROWS, COLS), row at[i] set to kinds[i](x); distributed
    (features split over 2 ranks) the same on its block, at dist_at and dist_kinds."""
    xs, xd = t.input((ROWS, COLS), (None, "x"))
    bs = t.S.constant(np.zeros((LAYERS, ROWS, COLS), np.float32), (LAYERS, ROWS, COLS), "float32")
    bd = t.D.constant(np.zeros((LAYERS, ROWS, COLS // 2), np.float32), (LAYERS, ROWS, COLS // 2),
                      "float32")
    for kind, a, kd, ad in zip(kinds, at, dist_kinds or kinds, dist_at or at):
        us = t.sop("reshape", [t.sop(kind, [xs], (ROWS, COLS))], (1, ROWS, COLS))
        bs = t.sop("dynamic_update_slice", [bs, us, _int(t.S, a), _int(t.S, 0), _int(t.S, 0)],
                   (LAYERS, ROWS, COLS))
        ud = t.dop("reshape", [t.dop(kd, [xd], (ROWS, COLS // 2))], (1, ROWS, COLS // 2))
        bd = t.dop("dynamic_update_slice",
                   [bd, ud, _counted(t.D, ad), _counted(t.D, 0), _counted(t.D, 0)],
                   (LAYERS, ROWS, COLS // 2))
    t.output(bs, bd, (None, None, "x"))
    return bs, bd


def test_a_stack_written_row_by_row_on_both_sides_is_its_block():
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _stack(t)
    out = t.run()
    for r in range(2):
        assert (0, 0, r * COLS // 2) in out.offsets(s, d, r)
    assert out.result.verified


@pytest.mark.parametrize("dist_at, dist_kinds", [
    ((0, 2), None),                 # the second layer written at another row
    ((1, 0), None),                 # the layers swapped
    (None, ("neg", "tanh")),        # another value written
])
def test_a_stack_written_elsewhere_or_otherwise_is_not_related(dist_at, dist_kinds):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _stack(t, dist_at=dist_at, dist_kinds=dist_kinds)
    out = t.run()
    assert out.views(s, d) == []
    assert not out.result.verified


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH "
                    "(../shared/tools/souffle/setup.sh, then put its bin/ on PATH)")
def test_souffle_derives_the_same_stack_views(monkeypatch):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    _stack(t)
    assert_engines_agree(t.problem(), monkeypatch)


# ---------------------------------------------- a start known only at run time (a KV cache)

def _cache_write(t, shift_dist: bool):
    """cache (ROWS, COLS) with features split over 2 ranks, one row written at the run-time
    position p (an int input, replicated) on both sides, or at p + 1 on the distributed."""
    cs, cd = t.input((ROWS, COLS), (None, "x"))
    us, ud = t.input((1, COLS), (None, "x"))
    ps, pd = t.input((), (), dtype="int32")
    zs, zd = _int(t.S, 0), _int(t.D, 0)
    if shift_dist:
        pd = t.D.op("add", [pd, _int(t.D, 1)], (), "int32")
    ys = t.sop("dynamic_update_slice", [cs, us, ps, zs], (ROWS, COLS))
    yd = t.dop("dynamic_update_slice", [cd, ud, pd, zd], (ROWS, COLS // 2))
    return ys, yd


def test_a_write_at_the_same_run_time_start_keeps_the_block():
    t = Tiny()
    ys, yd = _cache_write(t, shift_dist=False)
    out = t.run()
    for r in range(2):
        assert {v.offsets for v in out.views(ys, yd, r)} == {(0, 3 * r)}


def test_a_write_at_another_run_time_start_is_not_related():
    t = Tiny()
    ys, yd = _cache_write(t, shift_dist=True)
    out = t.run()
    assert out.views(ys, yd) == []
