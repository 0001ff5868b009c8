"""Rank-dependent dynamic_slice starts computed with integer arithmetic of XLA's
semantics (bitwise ops, truncating division, remainders, shifts, wrapping
casts): the folder, the exporter's clamp and the interpreter agree, and every
derived view holds numerically (tests/rulekit.py runs the interpreter)."""
import numpy as np
from rulekit import Tiny

from dlverify.ir import Mesh

UNIT = (0, 0, 0, 0)
RANKS = 4


def _const(t, value, dtype="int32"):
    return t.D.constant(np.asarray(value, dtype=dtype), (), dtype)


def _start(t, kind, operand, dtype="int32"):
    """axis_index (op) operand, an int scalar of the distributed program."""
    i = t.D.op("axis_index", [], (), dtype, {"axis": "x"})
    return t.D.op(kind, [i, _const(t, operand, dtype)], (), dtype)


def _offsets(out, s, d):
    """The row offset of the complete unit-scale view of d on each rank."""
    got = []
    for r in range(RANKS):
        rows = {v.offsets[0] for v in out.views(s, d, r) if v.partial is None and v.scale == UNIT}
        assert len(rows) == 1, (r, rows)
        got.append(rows.pop())
    return got


def _window(t, xd, start, rows=2):
    zero = _const(t, 0)
    return t.dop("dynamic_slice", [xd, start, zero], (rows, 4), slice_sizes=(rows, 4))


def test_bitwise_starts_are_bitwise():
    t = Tiny(mesh=Mesh(("x",), (RANKS,)))
    xs, xd = t.input((16, 4))
    a = _window(t, xd, _start(t, "and", 6))     # r & 6: 0, 0, 2, 2 (logical and would give 0, 1, 1, 1)
    b = _window(t, xd, _start(t, "or", 2))      # r | 2: 2, 3, 2, 3
    c = _window(t, xd, _start(t, "xor", 5))     # r ^ 5: 5, 4, 7, 6
    d = _window(t, xd, _start(t, "shift_left", 2))            # r << 2: 0, 4, 8, 12
    not_r = t.D.op("not", [t.D.op("axis_index", [], (), "int32", {"axis": "x"})], (), "int32")
    e = _window(t, xd, t.D.op("add", [not_r, _const(t, 8)], (), "int32"))   # ~r + 8 = 7 - r
    out = t.run()
    assert _offsets(out, xs, a) == [0, 0, 2, 2]
    assert _offsets(out, xs, b) == [2, 3, 2, 3]
    assert _offsets(out, xs, c) == [5, 4, 7, 6]
    assert _offsets(out, xs, d) == [0, 4, 8, 12]
    assert _offsets(out, xs, e) == [7, 6, 5, 4]


def test_division_remainder_and_clamped_starts():
    t = Tiny(mesh=Mesh(("x",), (RANKS,)))
    xs, xd = t.input((8, 4))
    minus = _start(t, "sub", 2)                                      # r - 2: -2, -1, 0, 1
    q = _window(t, xd, t.D.op("div", [minus, _const(t, 2)], (), "int32"))      # -1, 0, 0, 0
    m = _window(t, xd, t.D.op("rem", [_start(t, "mul", 5), _const(t, -4)], (), "int32"))
    big = _window(t, xd, _start(t, "mul", 3), rows=4)                # 0, 3, 6, 9 -> clamp at 4
    out = t.run()
    assert _offsets(out, xs, q) == [0, 0, 0, 0]      # trunc(-1/2) = 0; -1 clamps to 0
    assert _offsets(out, xs, m) == [0, 1, 2, 3]      # 5r rem -4 has the dividend's sign
    assert _offsets(out, xs, big) == [0, 3, 4, 4]    # XLA clamps into [0, 8 - 4]


def test_shift_amounts_past_the_width_and_unsigned_starts():
    t = Tiny(mesh=Mesh(("x",), (RANKS,)))
    xs, xd = t.input((8, 4))
    i = t.D.op("axis_index", [], (), "int32", {"axis": "x"})
    by = t.D.op("add", [i, _const(t, 30)], (), "int32")             # 30, 31, 32, 33
    sl = t.D.op("shift_left", [_const(t, 4), by], (), "int32")      # 0 (wraps), 0, 0, 0
    srl = t.D.op("shift_right_logical", [_const(t, -8), by], (), "int32")   # 3, 1, 0, 0
    u = t.D.op("axis_index", [], (), "uint32", {"axis": "x"})
    wrapped = t.D.op("sub", [u, _const(t, 1, "uint32")], (), "uint32")     # 2^32 - 1, 0, 1, 2
    a = _window(t, xd, sl)
    b = _window(t, xd, srl)
    c = _window(t, xd, wrapped)
    out = t.run()
    assert _offsets(out, xs, a) == [0, 0, 0, 0]
    assert _offsets(out, xs, b) == [3, 1, 0, 0]
    assert _offsets(out, xs, c) == [6, 0, 1, 2]      # unsigned 2^32 - 1 clamps to 8 - 2
