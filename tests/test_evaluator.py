"""The shared evaluator (dlverify/ops) against JAX on CPU: integer and bool
semantics must be XLA's exactly, since folded values become slice offsets.

Each case runs the IR kind through `evaluate` and the matching lax primitive
on the same edge values (negative operands, MIN/MAX, shifts by the bit width
and more, division by zero) and compares bit for bit.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dlverify.frontends.jaxpr import Ctx, walk
from jax import lax

from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.ops import NotExecutable, evaluate

EDGES = {
    "int8": [-128, -127, -7, -6, -3, -1, 0, 1, 2, 3, 6, 7, 8, 9, 126, 127],
    "int32": [-2**31, -2**31 + 1, -7, -6, -1, 0, 1, 2, 3, 6, 7, 31, 32, 33, 2**31 - 1],
    "uint32": [0, 1, 2, 3, 6, 7, 31, 32, 33, 2**31, 2**32 - 2, 2**32 - 1],
    "bool": [False, True],
}
INTS = ["int8", "int32", "uint32"]


def _pairs(dtype):
    a, b = zip(*itertools.product(EDGES[dtype], repeat=2))
    return np.array(a, dtype=dtype), np.array(b, dtype=dtype)


def _same(got, want):
    want = np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    bad = got != want
    if np.issubdtype(want.dtype, np.floating):
        bad &= ~(np.isnan(got) & np.isnan(want))
    assert not np.any(bad), list(zip(got[bad][:5], want[bad][:5]))


def _ev(kind, ins, dtype, **params):
    ins = [np.asarray(x) for x in ins]
    shape = np.broadcast_shapes(*(x.shape for x in ins)) if ins else ()
    return evaluate(kind, params, ins, shape, dtype)


BITWISE = [("and", lax.bitwise_and), ("or", lax.bitwise_or), ("xor", lax.bitwise_xor)]
ARITH = [("add", lax.add), ("sub", lax.sub), ("mul", lax.mul), ("max", lax.max), ("min", lax.min)]
INT_ONLY = [("div", lax.div), ("rem", lax.rem), ("shift_left", lax.shift_left),
            ("shift_right_logical", lax.shift_right_logical),
            ("shift_right_arithmetic", lax.shift_right_arithmetic)]
COMPARE = [("eq", lax.eq), ("ne", lax.ne), ("lt", lax.lt), ("le", lax.le), ("gt", lax.gt),
           ("ge", lax.ge)]


@pytest.mark.parametrize("dtype", INTS + ["bool"])
@pytest.mark.parametrize("kind,fn", BITWISE + COMPARE, ids=[k for k, _ in BITWISE + COMPARE])
def test_bitwise_and_compare_match_lax(kind, fn, dtype):
    a, b = _pairs(dtype)
    out = "bool" if (kind, fn) in COMPARE else dtype
    _same(_ev(kind, [a, b], out), fn(a, b))


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("kind,fn", ARITH + INT_ONLY, ids=[k for k, _ in ARITH + INT_ONLY])
def test_integer_arithmetic_matches_lax(kind, fn, dtype):
    a, b = _pairs(dtype)
    _same(_ev(kind, [a, b], dtype), fn(a, b))


def test_the_reported_cases():
    six, three = np.int32(6), np.int32(3)
    assert _ev("and", [six, three], "int32") == 2          # not logical True
    assert _ev("not", [six], "int32") == -7
    assert _ev("or", [np.int32(1), np.int32(2)], "int32") == 3
    assert _ev("and", [np.bool_(True), np.bool_(False)], "bool") == np.bool_(False)
    assert _ev("div", [np.int32(-7), np.int32(2)], "int32") == -3   # toward zero
    assert _ev("rem", [np.int32(-7), np.int32(2)], "int32") == -1   # sign of the dividend


@pytest.mark.parametrize("dtype", INTS + ["bool"])
def test_not_matches_lax(dtype):
    x = np.array(EDGES[dtype], dtype=dtype)
    _same(_ev("not", [x], dtype), lax.bitwise_not(x))


INT_UNARY = [("neg", lax.neg), ("abs", lax.abs), ("sign", lax.sign),
             ("population_count", lax.population_count), ("clz", lax.clz), ("square", lax.square)]


@pytest.mark.parametrize("kind,fn,dtype", [(k, f, d) for k, f in INT_UNARY for d in INTS
                                           if not (k == "abs" and d == "uint32")],  # lax.abs refuses uint
                         ids=[f"{k}-{d}" for k, _ in INT_UNARY for d in INTS
                              if not (k == "abs" and d == "uint32")])
def test_integer_unary_matches_lax(kind, fn, dtype):
    x = np.array(EDGES[dtype], dtype=dtype)
    _same(_ev(kind, [x], dtype), fn(x))


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("y", [0, 1, 2, 3, 7])
def test_integer_pow_wraps_like_lax(dtype, y):
    x = np.array(EDGES[dtype], dtype=dtype)
    _same(_ev("integer_pow", [x], dtype, y=y), lax.integer_pow(x, y))


FLOATS = np.array([0.0, -0.0, 0.4, 0.5, 1.5, -1.5, 2.5, -2.5, 2.7, -2.7, 127.9, 128.0, -129.0,
                   3e9, -3e9, 1e20, -1e20, np.inf, -np.inf, np.nan], dtype=np.float32)


@pytest.mark.parametrize("dtype", INTS)
def test_float_to_int_truncates_and_saturates(dtype):
    _same(_ev("convert_to_int", [FLOATS], dtype), lax.convert_element_type(FLOATS, dtype))


def test_float_to_bool():
    _same(_ev("convert_to_bool", [FLOATS], "bool"), lax.convert_element_type(FLOATS, jnp.bool_))


@pytest.mark.parametrize("method", [lax.RoundingMethod.AWAY_FROM_ZERO, lax.RoundingMethod.TO_NEAREST_EVEN])
def test_round_methods(method):
    got = _ev("round", [FLOATS], "float32", rounding=str(method))
    _same(got.astype(np.float32), lax.round(FLOATS, method))


@pytest.mark.parametrize("dtype", INTS)
def test_select_n_and_clamp(dtype):
    a, b = _pairs(dtype)
    which = (np.arange(a.size) % 2).astype(bool)
    _same(_ev("select_n", [which, a, b], dtype), lax.select_n(which, a, b))
    lo, hi = np.array(2, dtype), np.array(7, dtype)
    _same(evaluate("clamp", {}, [lo, a, hi], a.shape, dtype), lax.clamp(lo, a, hi))


@pytest.mark.parametrize("dtype", INTS + ["bool"])
@pytest.mark.parametrize("kind,prim", [("reduce_and", lax.reduce_and_p), ("reduce_or", lax.reduce_or_p),
                                       ("reduce_xor", lax.reduce_xor_p)],
                         ids=["reduce_and", "reduce_or", "reduce_xor"])
def test_bitwise_reductions_match_lax(kind, prim, dtype):
    x = np.resize(np.array(EDGES[dtype][1:], dtype=dtype), (2, 4))
    for axes in [(0,), (1,), (0, 1)]:
        want = prim.bind(jnp.asarray(x), axes=axes)
        _same(evaluate(kind, {"axes": axes}, [x], want.shape, dtype), want)


@pytest.mark.parametrize("dtype", ["int8", "uint32"])
def test_sums_wrap_in_their_type(dtype):
    x = np.array(EDGES[dtype][-8:], dtype=dtype).reshape(2, 4)
    _same(evaluate("reduce_sum", {"axes": (1,)}, [x], (2,), dtype), jnp.sum(x, axis=1, dtype=dtype))
    _same(evaluate("cumsum", {"axis": 1, "reverse": False}, [x], x.shape, dtype),
          lax.cumsum(x, axis=1))


@pytest.mark.parametrize("index_dtype", ["int32", "uint32", "int8"])
def test_dynamic_slice_and_update_clamp_starts(index_dtype):
    """XLA clamps each start into [0, dim - size]: the primitives, not lax's wrappers
    (which first wrap negative starts around, as Python indexing does)."""
    x = np.arange(40, dtype=np.int32).reshape(8, 5)
    upd = -np.ones((3, 2), np.int32)
    info = np.iinfo(index_dtype)
    starts = np.array([info.min, -5, -1, 0, 2, 5, 6, 100, info.max], np.int64).astype(index_dtype)
    for i0, i1 in itertools.product(starts, starts[[2, 3, 4, 5]]):  # negatives wrap for uint32
        i0, i1 = np.asarray(i0), np.asarray(i1)
        want = lax.dynamic_slice_p.bind(jnp.asarray(x), i0, i1, slice_sizes=(3, 2))
        _same(evaluate("dynamic_slice", {"slice_sizes": (3, 2)}, [x, i0, i1], (3, 2), "int32"), want)
        want = lax.dynamic_update_slice_p.bind(jnp.asarray(x), jnp.asarray(upd), i0, i1)
        _same(evaluate("dynamic_update_slice", {}, [x, upd, i0, i1], x.shape, "int32"), want)


def test_no_semantics_is_not_executable():
    with pytest.raises(NotExecutable):
        evaluate("custom_call", {}, [np.zeros(2)], (2,), "float32")
    with pytest.raises(NotExecutable):
        evaluate("constant", {"value": None}, [], (2,), "float32")
    with pytest.raises(NotExecutable):   # lax refuses it; no guess here either
        evaluate("integer_pow", {"y": -1}, [np.int32(2)], (), "int32")


def _graph_of(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    g = Graph("probe")
    b = GraphBuilder(g, IdAllocator())
    g.inputs = [b.tensor(np.shape(a), str(np.asarray(a).dtype)) for a in args]
    g.outputs = walk(Ctx(b, None, False), closed, g.inputs)
    return g


def test_interpreter_runs_jaxpr_integer_programs_like_jax():
    """Through the jaxpr frontend and the interpreter (what rule tests and witnesses
    run): rank-offset arithmetic of the kind examples/bitwise_offset.py uses."""
    def offsets(i, x):
        a = ((i * 3) & 3) << 1
        b = (i ^ 1) | (i >> 1)
        c = jnp.where(i < 2, -i // 2, i % -3)
        d = lax.shift_right_logical(~i, jnp.int32(28)) + lax.population_count(i) + lax.clz(i)
        e = lax.convert_element_type(x, jnp.int8) + jnp.int8(100)  # saturates, then wraps
        f = (i * 50).astype(jnp.int8) < 0                # narrowing int -> int wraps
        h = lax.shift_right_logical(i.astype(jnp.uint32), jnp.uint32(28))
        return a, b, c, d, e, f, h

    i = np.arange(-4, 8, dtype=np.int32)
    x = np.linspace(-300.0, 300.0, 12).astype(np.float32)
    g = _graph_of(offsets, i, x)
    vals = Interpreter(g, 1).run([[i], [x]])
    for t, want in zip(g.outputs, offsets(i, x)):
        _same(vals[t][0], want)


@pytest.mark.parametrize("config", [((1, 2, 0), (0, 0, 0)), ((-1, 2, 1), (2, -2, 2)),
                                    ((0, -3, 0), (-1, 1, 1))])
def test_pad_with_negative_and_interior_padding(config):
    x = np.arange(20, dtype=np.int32).reshape(4, 5)
    want = lax.pad(x, np.int32(-9), config)
    _same(evaluate("pad", {"padding_config": config}, [x, np.int32(-9)], want.shape, "int32"), want)


def test_the_hlo_lowering_folds_through_the_same_evaluator():
    """frontends/hlo/fold.py (loop counters, branch selectors) is the shared evaluator."""
    from dlverify.frontends.hlo.fold import eval_small

    i32 = np.int32
    assert eval_small("xor", [np.asarray(i32(6)), np.asarray(i32(3))], (), {}, "int32") == 5
    assert eval_small("not", [np.asarray(i32(6))], (), {}, "int32") == -7
    assert eval_small("div", [np.asarray(i32(-7)), np.asarray(i32(2))], (), {}, "int32") == -3
    assert eval_small("shift_right_logical", [np.asarray(i32(-8)), np.asarray(i32(31))], (), {},
                      "int32") == 1
    assert eval_small("custom_call", [], (), {}, "int32") is None


@pytest.mark.parametrize("dims", [(0, 1, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1)])
def test_broadcast_with_dims_in_any_order_maps_operand_dim_i_to_output_dim_dims_i(dims):
    # HLO allows broadcast dimensions out of order (a broadcast that also transposes); the
    # fact export reads them so, and the evaluator once reshaped as if they were sorted
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    out_shape = [5, 0, 0, 0]
    for i, d in enumerate(dims):
        out_shape[d + 1] = x.shape[i]
    got = evaluate("broadcast_in_dim", {"broadcast_dimensions": tuple(d + 1 for d in dims)}, [x],
                   tuple(out_shape), "float32")
    inverse = np.argsort(dims)  # output dim j holds operand dim inverse[j]
    want = np.broadcast_to(np.transpose(x, inverse), tuple(out_shape))
    assert got.shape == tuple(out_shape)
    np.testing.assert_array_equal(got, want)
    for idx in itertools.product(*(range(n) for n in out_shape)):
        assert got[idx] == x[tuple(idx[d + 1] for d in dims)]


@pytest.mark.parametrize("reverse", [False, True])
def test_cumlogsumexp_is_laxs(reverse):
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32) * 30
    np.testing.assert_allclose(
        evaluate("cumlogsumexp", {"axis": 1, "reverse": reverse}, [x], x.shape, "float32"),
        np.asarray(lax.cumlogsumexp(x, axis=1, reverse=reverse), np.float64), rtol=1e-5)
