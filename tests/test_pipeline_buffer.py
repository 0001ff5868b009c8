"""update.dl, a buffer filled window by window (Upd_Grow): a dynamic_update_slice
writing rows of a sequential tensor next to the rows a buffer of zeros already holds
of it joins their ranges of the mask family; the whole range is the tensor.

Every view a tiny program derives is checked numerically (rulekit), on clingo and on
Soufflé; a row written at another slot, or scaled otherwise, is not related. Then
examples/pipeline_buffer.py's fori_loop schedule with its slot shifted by one either
way is not verified (the example's own cases run in tests/test_examples_e2e.py)."""
import importlib.util
import shutil

import jax.numpy as jnp
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


def _fill(t, rows=1, order=None, slots=None, scale_at=None, split=False):
    """Sequential s = neg(x) of shape (SLOTS, COLS). Distributed: a buffer of zeros into
    which window j writes rows [rows * order[j], + rows) of neg(x) at row slots[j]
    (by default the same rows); window scale_at is written doubled. With split, the
    features are split over the ranks; else each rank holds all of x."""
    spec = (None, "x") if split else ()
    xs, xd = t.input((SLOTS, COLS), spec)
    cols = COLS // 2 if split else COLS
    s = t.sop("neg", [xs], (SLOTS, COLS))
    y = t.dop("neg", [xd], (SLOTS, cols))
    buf = t.D.constant(np.zeros((SLOTS, cols), np.float32), (SLOTS, cols), "float32")
    order = order if order is not None else list(range(SLOTS // rows))
    slots = slots if slots is not None else [rows * j for j in order]
    for j, (i, at) in enumerate(zip(order, slots)):
        u = t.dop("slice", [y], (rows, cols), start_indices=(rows * i, 0),
                  limit_indices=(rows * i + rows, cols), strides=None)
        if j == scale_at:
            u = t.dop("mul", [u, t.dconst(2.0, (rows, cols))], (rows, cols))
        buf = t.dop("dynamic_update_slice", [buf, u, _int(t.D, at), _int(t.D, 0)], (SLOTS, cols))
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


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH "
                    "(../shared/tools/souffle/setup.sh, then put its bin/ on PATH)")
def test_souffle_derives_the_same_buffer_views(monkeypatch):
    t = Tiny(mesh=Mesh(("x",), (2,)))
    _fill(t, order=[1, 2, 0, 3], split=True)
    assert_engines_agree(t.problem(), monkeypatch)


@pytest.mark.parametrize("shift", [1, -1])
def test_the_loop_schedule_writing_the_wrong_slot_is_not_verified(shift):
    spec = importlib.util.spec_from_file_location("_dlverify_pipeline_buffer",
                                                  EXAMPLES / "pipeline_buffer.py")
    pb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pb)

    def local(w, xs):
        stage = lax.axis_index("pp")
        state = jnp.zeros((pb.BATCH, pb.WIDTH), jnp.float32)
        outputs = jnp.zeros((pb.MICRO, pb.BATCH, pb.WIDTH), jnp.float32)
        _, outputs = lax.fori_loop(0, pb.STEPS, pb._loop_body(w, xs, stage, shift), (state, outputs))
        return lax.psum(outputs, "pp")

    res = verify_jax(pb.pipeline_seq, pb._dist(local), *pb._args())
    assert not res.verified, res.outputs
    assert any(f.op == "dynamic_update_slice" for f in res.failures), \
        [(f.op, f.line, f.message) for f in res.failures[:3]]
