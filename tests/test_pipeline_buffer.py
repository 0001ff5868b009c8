"""update.dl, a buffer filled window by window. Upd_Grow: a dynamic_update_slice
writing rows of a sequential tensor next to the rows a buffer of zeros already holds
of it joins their ranges of the mask family; the whole range is the tensor. Upd_Row:
the last write wins; slots first written with values related to nothing (or a buffer
of unknown values) and then each with its row of a sequential tensor are the tensor.

Every view a tiny program derives is checked numerically (rulekit, and each partial
view of a mask family on its own rank), on clingo and on Soufflé; a row written at
another slot, scaled otherwise, overwritten later by other values or never written is
not related. Then
examples/pipeline_buffer.py's fori_loop schedule with its slot shifted by one either
way is not verified (the example's own cases run in tests/test_examples_e2e.py)."""
import importlib.util
import shutil
import sys

import numpy as np
import pytest
from conftest import EXAMPLES
from jax import lax
from rulekit import Tiny, assert_engines_agree

from dlverify.api import verify_jax
from dlverify.ir import Mesh
from dlverify.numeric import run_both
from dlverify.verdict import scale_value
from dlverify.schema import TAG_MASK_BASE, TAG_PAIR

SLOTS, COLS = 4, 6      # the buffer: (slot, feature); features split over 2 ranks


def _int(b, value):
    return b.constant(np.asarray(value, dtype=np.int32), (), "int32")


def _fill(t, rows=1, order=None, slots=None, scale_at=None, split=False, junk=(), after=(),
          base="zeros"):
    """Sequential s = neg(x) of shape (SLOTS, COLS). Distributed: a buffer (zeros, or with
    base="input" an input of the distributed program that the sequential one ignores)
    into which window j writes rows [rows * order[j], + rows) of neg(x) at row slots[j]
    (by default the same rows); window scale_at is written doubled. Before them, each
    (n, at) of `junk` writes n rows of exp(x), related to nothing, at row `at`; after
    them, each of `after` does. With split, the features are split over the ranks; else
    each rank holds all of x."""
    spec = (None, "x") if split else ()
    xs, xd = t.input((SLOTS, COLS), spec)
    cols = COLS // 2 if split else COLS
    s = t.sop("neg", [xs], (SLOTS, COLS))
    y = t.dop("neg", [xd], (SLOTS, cols))
    e = t.dop("exp", [xd], (SLOTS, cols))
    if base == "input":
        buf = t.input((SLOTS, cols))[1]
    else:
        buf = t.D.constant(np.zeros((SLOTS, cols), np.float32), (SLOTS, cols), "float32")

    def write(buf, src, i, n, at):
        u = t.dop("slice", [src], (n, cols), start_indices=(i, 0), limit_indices=(i + n, cols),
                  strides=None)
        return t.dop("dynamic_update_slice", [buf, u, _int(t.D, at), _int(t.D, 0)], (SLOTS, cols))

    for n, at in junk:
        buf = write(buf, e, 0, n, at)
    order = order if order is not None else list(range(SLOTS // rows))
    slots = slots if slots is not None else [rows * j for j in order]
    for j, (i, at) in enumerate(zip(order, slots)):
        src = t.dop("mul", [y, t.dconst(2.0, (SLOTS, cols))], (SLOTS, cols)) if j == scale_at else y
        buf = write(buf, src, rows * i, rows, at)
    for n, at in after:
        buf = write(buf, e, 0, n, at)
    t.output(s, buf, spec)
    return s, buf


def _assert_mask_terms_hold(out, seeds=(0, 1)):
    """Each partial view of a mask family, on its own rank (the buffer part-filled: its
    range tiles nothing, so rulekit's tiling check does not see it), equals c times the
    sequential tensor masked to the rows [lo, hi) along k, zero elsewhere, on its block.
    Returns how many such views were checked."""
    views = [v for v in out.result.views if v.partial is not None
             and TAG_MASK_BASE <= v.partial.axis < TAG_MASK_BASE + TAG_PAIR]
    for seed in seeds:
        run = run_both(out.problem, seed)
        for v in views:
            k = v.partial.axis - TAG_MASK_BASE
            s = np.asarray(run.seq[v.seq][0], dtype=np.float64)
            keep = np.zeros(s.shape[k], bool)
            keep[v.partial.lo:v.partial.hi] = True
            masked = np.where(keep.reshape([-1 if j == k else 1 for j in range(s.ndim)]), s, 0.0)
            d = np.asarray(run.dist[v.dist][v.rank], dtype=np.float64)
            block = masked[tuple(slice(max(o, 0), max(o, 0) + n) for o, n in zip(v.offsets, d.shape))]
            want = float(scale_value(v.scale)) * block
            assert want.shape == d.shape and np.max(np.abs(d - want)) <= 1e-9, f"unsound view {v}"
    return len(views)


@pytest.mark.parametrize("rows, order", [
    (1, None),                  # rows 0, 1, 2, 3: each window after the range held
    (1, [3, 2, 1, 0]),          # each window before it
    (1, [1, 2, 0, 3]),          # after, after, before, after
    (2, None),                  # windows of two rows
])
def test_windows_next_to_the_rows_held_fill_the_buffer(rows, order):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _fill(t, rows=rows, order=order)
    out = t.run()
    assert _assert_mask_terms_hold(out) >= 2 * (SLOTS // rows)   # every window, on both ranks
    for r in range(2):
        assert (0, 0) in out.offsets(s, d, r)
    assert out.result.verified


def test_a_buffer_of_feature_blocks_is_their_block():
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _fill(t, split=True)
    out = t.run()
    assert _assert_mask_terms_hold(out) >= 2 * SLOTS
    for r in range(2):
        assert (0, r * COLS // 2) in out.offsets(s, d, r)
    assert out.result.verified


@pytest.mark.parametrize("slots, scale_at", [
    ([0, 2, 2, 3], None),       # row 1 written into slot 2 (and overwritten)
    ([1, 2, 3, 0], None),       # every row one slot on
    (None, 2),                  # row 2 written doubled
])
def test_a_row_in_another_slot_or_scaled_otherwise_is_not_related(slots, scale_at):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _fill(t, slots=slots, scale_at=scale_at)
    out = t.run()
    assert out.views(s, d) == []
    assert not out.result.verified


# ---- the last write wins (Upd_Row): slots first written with values related to nothing

@pytest.mark.parametrize("junk, base", [
    ([(1, 1), (1, 2), (1, 3)], "zeros"),   # a pipeline's warm-up, overwritten slot by slot
    ([(2, 0), (3, 1)], "zeros"),           # wider junk windows
    ([], "input"),                         # a buffer of unknown values, every slot written
    ([(4, 0)], "input"),
])
def test_slots_written_last_with_the_rows_are_the_rows(junk, base):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _fill(t, order=[0, 1, 2, 3], junk=junk, base=base)
    out = t.run()
    for r in range(2):
        assert (0, 0) in out.offsets(s, d, r)
    assert out.result.verified


def test_a_buffer_of_feature_blocks_written_last_is_their_block():
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _fill(t, order=[2, 0, 3, 1], junk=[(1, 1), (2, 2)], split=True, base="input")
    out = t.run()
    for r in range(2):
        assert (0, r * COLS // 2) in out.offsets(s, d, r)
    assert out.result.verified


@pytest.mark.parametrize("order, after, base", [
    ([0, 1, 2, 3], [(1, 2)], "zeros"),     # junk written last into slot 2
    ([0, 1, 2, 3], [(2, 1)], "input"),     # ... into slots 1 and 2
    ([0, 1, 2], [], "input"),              # slot 3 never written: unknown
    ([0, 1, 3], [], "zeros"),              # slot 2 never written: zero, not row 2
])
def test_a_slot_written_last_with_junk_or_never_is_not_related(order, after, base):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    s, d = _fill(t, order=order, after=after, base=base)
    out = t.run()
    assert [v for v in out.views(s, d) if v.partial is None] == []
    assert not out.result.verified


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH "
                    "(../shared/tools/souffle/setup.sh, then put its bin/ on PATH)")
def test_souffle_derives_the_same_buffer_views(monkeypatch):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    _fill(t, order=[1, 2, 0, 3], split=True)
    assert_engines_agree(t.problem(), monkeypatch)


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH "
                    "(../shared/tools/souffle/setup.sh, then put its bin/ on PATH)")
def test_souffle_derives_the_same_last_write_views(monkeypatch):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    _fill(t, order=[2, 0, 3, 1], junk=[(1, 1), (2, 2)], split=True, base="input")
    assert_engines_agree(t.problem(), monkeypatch)


def _example():
    """examples/pipeline_buffer.py as a module (it imports its sibling pipeline_gpipe)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec = importlib.util.spec_from_file_location("_dlverify_pipeline_buffer",
                                                      EXAMPLES / "pipeline_buffer.py")
        pb = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pb)
    finally:
        sys.path.remove(str(EXAMPLES))
    return pb


@pytest.mark.parametrize("shift", [1, -1])
def test_the_loop_schedule_writing_the_wrong_slot_is_not_verified(shift):
    pb = _example()

    def local(w, xs):
        return lax.psum(pb.fori(w, xs, slot_shift=shift), "pp")

    res = verify_jax(pb.pipeline_seq, pb._dist(local), *pb._args())
    assert not res.verified, res.outputs
    assert any(f.op == "dynamic_update_slice" for f in res.failures), \
        [(f.op, f.line, f.message) for f in res.failures[:3]]


@pytest.mark.parametrize("shift", [1, -1, 2])
def test_the_modulo_schedule_writing_the_wrong_slot_is_not_verified(shift):
    """The JAX tutorial's form, every slot written at every step (the last write wins),
    with the slot (t - (S - 1) + shift) % M."""
    pb = _example()

    def local(w, xs):
        slot = lambda t: (t - (pb.STAGES - 1) + shift) % pb.MICRO  # noqa: E731
        return lax.psum(pb.unrolled(w, xs, slot, pb.set_slot), "pp")

    res = verify_jax(pb.pipeline_seq, pb._dist(local), *pb._args())
    assert not res.verified, res.outputs
