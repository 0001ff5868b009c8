"""The patterns of the Neuron Llama files, in small, on the rules that relate
them (layout.dl, elementwise.dl, contraction.dl): GQA head broadcasting through
reshape/broadcast/reshape, rotary embeddings from slices and a concatenate,
softmax with max/sum reductions, and the RMSNorm expansion of the custom-call
registry. Each correct form verifies, each wrong form derives nothing for the
wrong op, and every derived view is checked numerically."""
import numpy as np
from rulekit import Tiny

UNIT = (0, 0, 0, 0)


def vset(out, s, d, r):
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


# ---------------------------------------------------------------- GQA

def gqa(t, kv_first=True):
    """K [S, B, KV, D] with its KV heads split; each KV head repeated REP times into
    the query heads: broadcast to [S, B, KV, REP, D] and merge (KV, REP)."""
    S, B, KV, REP, D = 4, 2, 4, 2, 3
    ks, kd = t.input((S, B, KV, D), (None, None, "x", None))
    kvd = KV // 2
    if kv_first:
        bs = t.sop("broadcast_in_dim", [ks], (S, B, KV, REP, D), broadcast_dimensions=(0, 1, 2, 4))
        bd = t.dop("broadcast_in_dim", [kd], (S, B, kvd, REP, D), broadcast_dimensions=(0, 1, 2, 4))
    else:   # repeats outermost: query head h uses KV head h % KV
        bs = t.sop("broadcast_in_dim", [ks], (S, B, REP, KV, D), broadcast_dimensions=(0, 1, 3, 4))
        bd = t.dop("broadcast_in_dim", [kd], (S, B, REP, kvd, D), broadcast_dimensions=(0, 1, 3, 4))
    rs = t.sop("reshape", [bs], (S, B, KV * REP, D))
    rd = t.dop("reshape", [bd], (S, B, kvd * REP, D))
    return rs, rd


def test_gqa_broadcast_keeps_each_ranks_query_heads_contiguous():
    t = Tiny()
    rs, rd = gqa(t)
    t.output(rs, rd, (None, None, "x", None))
    out = t.run()
    for r in range(2):
        assert vset(out, rs, rd, r) == {((0, 0, 4 * r, 0), None, UNIT)}
    assert out.result.verified


def test_gqa_with_the_repeats_outermost_is_not_a_block():
    # rank r's KV heads land on query heads {r*2, r*2+1, 4+r*2, 4+r*2+1}: not one block
    t = Tiny()
    rs, rd = gqa(t, kv_first=False)
    out = t.run()
    assert out.views(rs, rd) == []


# ---------------------------------------------------------------- rotary

def rotary(t, swap=False):
    """x [S, H, D] with its heads split; rot(x) = concat(x1*cos - x2*sin, x2*cos + x1*sin)
    over the last dim, cos/sin [S, D/2] replicated."""
    S, H, D = 4, 4, 6
    xs, xd = t.input((S, H, D), (None, "x", None))
    cs, cd = t.input((S, D // 2))
    ss, sd = t.input((S, D // 2))
    h = H // 2

    def side(op, x, c, s, heads):
        sh = (S, heads, D // 2)
        x1 = op("slice", [x], sh, start_indices=(0, 0, 0), limit_indices=(S, heads, D // 2),
                strides=None)
        x2 = op("slice", [x], sh, start_indices=(0, 0, D // 2), limit_indices=(S, heads, D),
                strides=None)
        cb = op("broadcast_in_dim", [c], sh, broadcast_dimensions=(0, 2))
        sb = op("broadcast_in_dim", [s], sh, broadcast_dimensions=(0, 2))
        a = op("sub", [op("mul", [x1, cb], sh), op("mul", [x2, sb], sh)], sh)
        b = op("add", [op("mul", [x2, cb], sh), op("mul", [x1, sb], sh)], sh)
        return a, b

    a_s, b_s = side(t.sop, xs, cs, ss, H)
    a_d, b_d = side(t.dop, xd, cd, sd, h)
    ys = t.sop("concatenate", [a_s, b_s], (S, H, D), dimension=2)
    yd = t.dop("concatenate", [b_d, a_d] if swap else [a_d, b_d], (S, h, D), dimension=2)
    return ys, yd


def test_rotary_halves_recombine_into_the_heads_block():
    t = Tiny()
    ys, yd = rotary(t)
    t.output(ys, yd, (None, "x", None))
    out = t.run()
    for r in range(2):
        assert vset(out, ys, yd, r) == {((0, 2 * r, 0), None, UNIT)}
    assert out.result.verified


def test_rotary_with_the_halves_swapped_is_not_verified():
    t = Tiny()
    ys, yd = rotary(t, swap=True)
    t.output(ys, yd, (None, "x", None))
    out = t.run()
    assert out.views(ys, yd) == [] and not out.result.verified


# ---------------------------------------------------------------- softmax

def softmax(t, sharded_dim):
    """softmax over the last dim of scores [H, Q, K], the heads (dim 0) or the keys (dim 2) split."""
    H, Q, K = 4, 3, 6
    spec = ("x", None, None) if sharded_dim == 0 else (None, None, "x")
    xs, xd = t.input((H, Q, K), spec)
    dshape = t.dist.tensors[xd].shape

    def side(op, x, shape):
        red = shape[:2]
        m = op("reduce_max", [x], red, axes=(2,))
        e = op("exp", [op("sub", [x, op("broadcast_in_dim", [m], shape, broadcast_dimensions=(0, 1))],
                          shape)], shape)
        s = op("reduce_sum", [e], red, axes=(2,))
        return op("div", [e, op("broadcast_in_dim", [s], shape, broadcast_dimensions=(0, 1))], shape)

    return side(t.sop, xs, (H, Q, K)), side(t.dop, xd, dshape)


def test_softmax_over_a_whole_dim_with_heads_split():
    t = Tiny()
    ys, yd = softmax(t, 0)
    t.output(ys, yd, ("x", None, None))
    out = t.run()
    for r in range(2):
        assert vset(out, ys, yd, r) == {((2 * r, 0, 0), None, UNIT)}
    assert out.result.verified


def test_softmax_over_a_split_dim_is_not_verified():
    # the max and the sum of one rank's keys are partial: exp(x - partial max) and the
    # division by a partial sum are not blocks of the sequential softmax
    t = Tiny()
    ys, yd = softmax(t, 2)
    t.output(ys, yd, (None, None, "x"))
    out = t.run()
    assert out.views(ys, yd) == [] and not out.result.verified


# ---------------------------------------------------------------- RMSNorm

def rms_norm(t, spec):
    """The registry's rms_norm expansion over dim 0 of x [H, T] (frontends/custom_calls.py):
    x * rsqrt(sum(x * x over 0) / H + eps) * w."""
    H, T = 6, 4
    xs, xd = t.input((H, T), spec)
    ws, wd = t.input((H,), spec[:1])
    dshape = t.dist.tensors[xd].shape

    def side(op, const, x, w, shape):
        rest = shape[1:]
        ss = op("reduce_sum", [op("mul", [x, x], shape)], rest, axes=(0,))
        mean = op("div", [ss, op("broadcast_in_dim", [const(float(H))], rest, broadcast_dimensions=())],
                  rest)
        v = op("add", [mean, op("broadcast_in_dim", [const(1e-5)], rest, broadcast_dimensions=())],
               rest)
        rb = op("broadcast_in_dim", [op("rsqrt", [v], rest)], shape, broadcast_dimensions=(1,))
        wb = op("broadcast_in_dim", [w], shape, broadcast_dimensions=(0,))
        return op("mul", [op("mul", [x, rb], shape), wb], shape)

    return side(t.sop, t.sconst, xs, ws, (H, T)), side(t.dop, t.dconst, xd, wd, dshape)


def test_rms_norm_of_replicated_and_of_token_split_inputs():
    for spec, out_spec in (((None, None), ()), ((None, "x"), (None, "x"))):
        t = Tiny()
        ys, yd = rms_norm(t, spec)
        t.output(ys, yd, out_spec)
        out = t.run()
        assert out.result.verified, spec
        assert np.all([v.complete for v in out.views(ys, yd)])


def test_rms_norm_over_a_split_hidden_dim_is_not_verified():
    # each rank's sum of squares covers half the hidden dim: rsqrt of a partial sum
    t = Tiny()
    ys, yd = rms_norm(t, ("x", None))
    t.output(ys, yd, ("x", None))
    out = t.run()
    assert out.views(ys, yd) == [] and not out.result.verified
    first = out.result.failures[0]
    assert (first.kind, first.op) == ("unreduced-partial", "reduce_sum")
