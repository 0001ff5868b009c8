"""update.dl, compiled buffers: XLA writes an update into zeros at a literal start as a
pad (`pad(u, 0), padding=a_h` along the one dim where u is smaller), so the first write
of a pipeline's output buffer (examples/pipeline_buffer.py, compiled) is a pad and the
later ones dynamic-update-slices. pad(u, 0) along k alone is dynamic_update_slice(zeros,
u, a along k): both give the mask-family terms of the rows u holds, or the window-family
terms of a sequential update into zeros (Upd_Zeros), and a pad of one row with any padding
value makes that row known (Upd_Write, Upd_Row).

The HLO pairs are the class as XLA writes it; the Tiny programs check every derived view
numerically with the shared evaluator (rulekit). A pad at a shifted row, with a nonzero
padding value or along a second dim is not such a write."""
# XLA_FLAGS (8 host devices): tests/conftest.py
import shutil

import numpy as np
import pytest
from hlo_pairs import EXAMPLES, assert_compiled_case_and_twin, assert_pair_verifies, compiled_pair, \
    verify_texts
from rulekit import Tiny, assert_engines_agree

from dlverify.cases import load_cases
from dlverify.partial_tags import MASK_BASE

ROWS, COLS = 4, 6

SEQ = f"""HloModule seq

ENTRY %main (x: f32[{ROWS},{COLS}]) -> f32[{ROWS},{COLS}] {{
  %x = f32[{ROWS},{COLS}] parameter(0)
  ROOT %t = f32[{ROWS},{COLS}] tanh(%x)
}}
"""

# Rank 1 (the last stage) computes tanh of the rows of x and writes them into a buffer,
# the first write a pad as XLA writes it; the other rank writes zeros; an all-reduce
# shares the buffer. PAD_VALUE, PADDING, SECOND_ROW are what the unsound variants change.
DIST = f"""HloModule dist, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

ENTRY %main (x: f32[{ROWS},{COLS}]) -> f32[{ROWS},{COLS}] {{
  %x = f32[{ROWS},{COLS}] parameter(0), sharding={{replicated}}
  %pid = u32[] partition-id()
  %one = u32[] constant(1)
  %last = pred[] compare(%pid, %one), direction=EQ
  %z = f32[] constant(0)
  %i0 = s32[] constant(0)
  %i1 = s32[] constant(1)
  %i3 = s32[] constant(3)
  %x0 = f32[1,WIDTH] slice(%x), slice={{[0:1], [0:WIDTH]}}
  %t0 = f32[1,WIDTH] tanh(%x0)
  %m0 = pred[1,WIDTH] broadcast(%last), dimensions={{}}
  %zb0 = f32[1,WIDTH] broadcast(%z), dimensions={{}}
  %u0 = f32[1,WIDTH] select(%m0, %t0, %zb0)
  %pv = f32[] constant(PAD_VALUE)
  %b0 = f32[{ROWS},{COLS}] pad(%u0, %pv), padding=PADDING
  %x1 = f32[2,{COLS}] slice(%x), slice={{[SECOND_ROW], [0:{COLS}]}}
  %t1 = f32[2,{COLS}] tanh(%x1)
  %m1 = pred[2,{COLS}] broadcast(%last), dimensions={{}}
  %zb1 = f32[2,{COLS}] broadcast(%z), dimensions={{}}
  %u1 = f32[2,{COLS}] select(%m1, %t1, %zb1)
  %b1 = f32[{ROWS},{COLS}] dynamic-update-slice(%b0, %u1, %i1, %i0)
  %x3 = f32[1,{COLS}] slice(%x), slice={{[3:4], [0:{COLS}]}}
  %t3 = f32[1,{COLS}] tanh(%x3)
  %m3 = pred[1,{COLS}] broadcast(%last), dimensions={{}}
  %zb3 = f32[1,{COLS}] broadcast(%z), dimensions={{}}
  %u3 = f32[1,{COLS}] select(%m3, %t3, %zb3)
  %b2 = f32[{ROWS},{COLS}] dynamic-update-slice(%b1, %u3, %i3, %i0)
  ROOT %sum = f32[{ROWS},{COLS}] all-reduce(%b2), channel_id=1, replica_groups={{{{0,1}}}}, use_global_device_ids=true, to_apply=%add
}}
"""


def _dist(pad_value="0", padding="0_3x0_0", second_row="1:3", width=COLS):
    text = DIST.replace("PAD_VALUE", pad_value).replace("PADDING", padding)
    return text.replace("SECOND_ROW", second_row).replace("WIDTH", str(width))


def test_a_buffer_whose_first_write_is_a_pad_verifies(tmp_path):
    assert_pair_verifies(tmp_path, SEQ, _dist(), ["out0 = r0.out0  (replicated on all 2 ranks)"])


@pytest.mark.parametrize("variant", [
    dict(padding="1_2x0_0"),                 # row 0 of tanh written at row 1
    dict(pad_value="1"),                     # the rows the pad adds are ones, not zeros
    dict(padding="0_3x1_0", width=COLS - 1),  # also padded along the columns: shifted
    dict(second_row="2:4"),                  # the next write holds other rows
])
def test_a_pad_at_another_row_value_or_dim_does_not_verify(tmp_path, variant):
    res = verify_texts(tmp_path, SEQ, _dist(**variant))
    assert not res.verified


# ------------------------------------------------------------------ Tiny programs

def _rows(t, x, lo, hi):
    return t.dop("slice", [x], (hi - lo, COLS), start_indices=(lo, 0), limit_indices=(hi, COLS),
                 strides=None)


def _int(t, value):
    return t.D.constant(np.asarray(value, dtype=np.int32), (), "int32")


def _pad_rows(t, u, n, before, value=0.0):
    """u (n rows) padded along dim 0 only, `before` rows before it, to ROWS rows."""
    return t.dop("pad", [u, t.dconst(value)], (ROWS, COLS),
                 padding_config=((before, ROWS - n - before, 0), (0, 0, 0)))


@pytest.mark.parametrize("value, family", [(0.0, True), (7.0, False)])
def test_a_pad_into_zeros_holds_the_rows_of_its_operand(value, family):
    """pad(tanh(x)[1:3], value) along the rows: with value 0, the terms [1, 3) of tanh's row
    mask family; with 7 nothing (the padding is no term of it)."""
    t = Tiny()
    xs, xd = t.input((ROWS, COLS))
    s = t.sop("tanh", [xs], (ROWS, COLS))
    u = t.dop("tanh", [_rows(t, xd, 1, 3)], (2, COLS))
    y = _pad_rows(t, u, 2, 1, value)
    out = t.run()
    views = {(v.offsets, v.partial.axis, v.partial.lo, v.partial.hi) for v in out.views(s, y)}
    assert views == ({((0, 0), MASK_BASE + 0, 1, 3)} if family else set())


def _buffer(windows):
    """Sequential tanh(x); distributed, tanh of x's rows [lo, hi) for each window in turn,
    the first padded into zeros at lo, the others written there by dynamic_update_slice."""
    t = Tiny()
    xs, xd = t.input((ROWS, COLS))
    s = t.sop("tanh", [xs], (ROWS, COLS))
    b = None
    for lo, hi in windows:
        u = t.dop("tanh", [_rows(t, xd, lo, hi)], (hi - lo, COLS))
        b = _pad_rows(t, u, hi - lo, lo) if b is None else \
            t.dop("dynamic_update_slice", [b, u, _int(t, lo), _int(t, 0)], (ROWS, COLS))
    t.output(s, b)
    return t, s, b


def test_a_pad_then_updates_filling_every_row_is_the_tensor():
    """pad(row 0) then dynamic_update_slices of rows [1, 3) and [3, 4): the whole family,
    so the buffer is tanh(x) on every rank."""
    t, s, b = _buffer([(0, 1), (1, 3), (3, 4)])
    out = t.run()
    assert out.result.verified
    for r in range(2):
        assert (0, 0) in out.offsets(s, b, r)


def test_a_one_row_pad_with_any_value_is_a_known_row_the_updates_complete():
    """pad(row 1, 7) leaves rows 0, 2, 3 sevens; one-row updates overwrite them (the last
    write wins, Upd_Row): the buffer is tanh(x). Without the last update it is not."""
    for complete in (True, False):
        t = Tiny()
        xs, xd = t.input((ROWS, COLS))
        s = t.sop("tanh", [xs], (ROWS, COLS))
        b = _pad_rows(t, t.dop("tanh", [_rows(t, xd, 1, 2)], (1, COLS)), 1, 1, value=7.0)
        for row in (0, 2, 3) if complete else (0, 2):
            u = t.dop("tanh", [_rows(t, xd, row, row + 1)], (1, COLS))
            b = t.dop("dynamic_update_slice", [b, u, _int(t, row), _int(t, 0)], (ROWS, COLS))
        t.output(s, b)
        out = t.run()
        assert out.result.verified is complete
        assert ((0, 0) in out.offsets(s, b, 0)) is complete


def test_a_distributed_pad_of_a_block_is_the_window_of_a_sequential_update():
    """Sequential dynamic_update_slice(zeros, neg(x), 2 along the rows); each rank pads its
    columns of neg(x) by 2 rows before and 1 after (the window family of the sequential
    update, all of its rows: the rank's columns of it). Padded 1 before, not related."""
    for before, related in ((2, True), (1, False)):
        t = Tiny()
        xs, xd = t.input((ROWS, COLS), (None, "x"))
        us = t.sop("neg", [xs], (ROWS, COLS))
        zs = t.S.constant(np.zeros((ROWS + 3, COLS), np.float32), (ROWS + 3, COLS), "float32")
        two = t.S.constant(np.asarray(2, dtype=np.int32), (), "int32")
        zero = t.S.constant(np.asarray(0, dtype=np.int32), (), "int32")
        ys = t.sop("dynamic_update_slice", [zs, us, two, zero], (ROWS + 3, COLS))
        ud = t.dop("neg", [xd], (ROWS, COLS // 2))
        yd = t.dop("pad", [ud, t.dconst(0.0)], (ROWS + 3, COLS // 2),
                   padding_config=((before, 3 - before, 0), (0, 0, 0)))
        t.output(ys, yd, (None, "x"))
        out = t.run()
        assert out.result.verified is related
        for r in range(2):
            assert ((0, r * COLS // 2) in out.offsets(ys, yd, r)) is related


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH "
                    "(../shared/tools/souffle/setup.sh, then put its bin/ on PATH)")
def test_souffle_derives_the_same_buffer_views(monkeypatch):
    t, _, _ = _buffer([(0, 2), (2, 4)])
    assert_engines_agree(t.problem(), monkeypatch)


# -------------------------------------------------- examples/pipeline_buffer.py, compiled

@pytest.fixture(scope="module")
def buffer():
    """The cases of examples/pipeline_buffer.py by name (loaded as `dlverify check-jax`
    loads them: it imports its neighbour pipeline_gpipe.py)."""
    return {name: fn for name, fn in load_cases(EXAMPLES / "pipeline_buffer.py")}


@pytest.mark.parametrize("name", ["buffer_unrolled_dus", "buffer_unrolled_at_set"])
def test_compiled_unrolled_buffers_verify(tmp_path, buffer, name):
    seq, dist = compiled_pair(buffer[name]())
    assert " pad(" in dist      # XLA's first write into the buffer of zeros
    res = verify_texts(tmp_path, seq, dist)
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]


def test_compiled_wrong_slot_twin_is_located(tmp_path, buffer):
    assert_compiled_case_and_twin(tmp_path, buffer["buffer_unrolled_at_set"](),
                                  buffer["buffer_bug_wrong_slot"]())


def test_compiled_missing_psum_twin_is_not_verified(tmp_path, buffer):
    """Not located at its `# BUG` line: XLA drops the reshape of that line (a bitcast fused
    into the last update, with the update's metadata), so no instruction names it."""
    seq, dist = compiled_pair(buffer["buffer_bug_missing_psum"]())
    res = verify_texts(tmp_path, seq, dist)
    assert not res.verified
