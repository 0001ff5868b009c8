"""Compiled forms of correct programs (bench/xla_examples.py): a reduce-window whose
windows tile its operand (XLA's CPU tree reduction rewriter splits a reduce of more
than 32 elements into one; `lax.reduce_window` with stride = window, a pooling)
lowers to pad, slice, reshape and a reduce (frontends/hlo/ops/reduction.py), and the
reduce of the tiles' results after it is, with it, the reduction of the operand
(dlverify/simplify_compiled.py). Each
computes, by the shared evaluator, what XLA computes, on several ranks, and fires
only where it applies; other windows are one-line errors naming the line. So do the
layout forms of size-1 dims and transposes (dlverify/simplify_layouts.py) that bring
the compiled parallel residual block and KV-cache decoding step to their programs'."""
# XLA_FLAGS (8 host devices): tests/conftest.py
import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from hlo_pairs import assert_compiled_case_and_twin, compiled_pair, example_module, verify_texts
from jax import lax
from rulekit import assert_views_hold
from test_simplify import _graph

from dlverify.errors import InputError, UnknownOpError
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module
from dlverify.interpret import Interpreter
from dlverify.ir import IdAllocator
from dlverify.simplify import simplify_graph

RANKS = 3


def _lower(text: str):
    ids = IdAllocator()
    g, _ = hlo_to_graph(parse_hlo_module(text, "t.hlo"), ids, "g")
    return g, ids


def _run(g, per_rank: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """`per_rank[i][r]`: input i on rank r; the outputs on every rank."""
    vals = Interpreter(g, RANKS).run(per_rank)
    return [vals[o] for o in g.outputs]


def _rank_inputs(rng, shapes, dtype=np.float32):
    return [[rng.standard_normal(s).astype(dtype) for _ in range(RANKS)] for s in shapes]


# ------------------------------------------------ reduce-window of tiles, from JAX
TILED = {
    # a long sum, compiled: XLA's CPU tree reduction writes reduce-window + reduce
    "sum_long_row": (lambda x: x.sum(axis=1), (4, 96)),
    "sum_long_rows_2d": (lambda x: x.sum(axis=(1, 2)), (2, 8, 64)),
    "max_long_row": (lambda x: x.max(axis=1), (3, 80)),           # 80 = 2*32 + 16: padded
    "mean_all": (lambda x: x.mean(), (8, 64)),
    # JAX's own reduce_window: pooling with stride = window
    "sum_pool": (lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 4), (1, 4), "VALID"), (3, 12)),
    "max_pool_2d": (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 3), (2, 3), "VALID"),
                    (4, 9)),
    "sum_pool_same": (lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 4), (1, 4), "SAME"),
                      (2, 10)),                                     # padded on both sides
    "min_pool_cut": (lambda x: lax.reduce_window(x, jnp.inf, lax.min, (1, 4), (1, 4), "VALID"),
                     (2, 11)),                                      # the last 3 in no window
}


@pytest.mark.parametrize("stage", ["pre", "post"])
@pytest.mark.parametrize("name", sorted(TILED))
def test_tiled_reduce_windows_compute_what_xla_computes(name, stage):
    fn, shape = TILED[name]
    low = jax.jit(fn).lower(jax.ShapeDtypeStruct(shape, jnp.float32))
    text = low.as_text(dialect="hlo") if stage == "pre" else low.compile().as_text()
    g, ids = _lower(text)
    assert "reduce-window" not in {op.kind for op in g.ops}
    rng = np.random.default_rng(0)
    ins = _rank_inputs(rng, [shape])
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    for graph in (before, g):
        (got,) = _run(graph, ins)
        for r in range(RANKS):
            np.testing.assert_allclose(got[r], np.asarray(fn(ins[0][r])), rtol=1e-5, atol=1e-5)


def test_compiled_long_sum_is_one_reduction_of_the_operand():
    """The tree form (reduce-window of 32s, then a reduce of the tiles' sums) is, in the
    normal form, the one reduce_sum the program wrote."""
    text = jax.jit(lambda x: x.sum(axis=2)).lower(
        jax.ShapeDtypeStruct((1, 8, 64), jnp.float32)).compile().as_text()
    assert "reduce-window" in text and "size=1x1x32" in text
    g, ids = _lower(text)
    simplify_graph(g, ids)
    (red,) = [op for op in g.ops if op.kind == "reduce_sum"]
    assert red.params["axes"] == (2,) and g.tensors[red.inputs[0]].shape == (1, 8, 64)
    assert not [op for op in g.ops if op.kind == "reshape"]


WINDOW_MODULE = """HloModule m

%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] maximum(%a, %b)
}

ENTRY %main (x: f32[4,6]) -> f32[OUT] {
  %x = f32[4,6] parameter(0)
  %z = f32[] constant(INIT)
  ROOT %w = f32[OUT] reduce-window(%x, %z), window={WINDOW}, to_apply=%max
}
"""


def _window_module(window, out, init="-inf"):
    return WINDOW_MODULE.replace("WINDOW", window).replace("OUT", out).replace("INIT", init)


@pytest.mark.parametrize("window, out, want", [
    ("size=2x3 stride=2x3", "2,2", lambda x: x.reshape(2, 2, 2, 3).max(axis=(1, 3))),
    ("size=1x4 stride=1x4 pad=0_0x1_1", "4,2",                     # padded by -inf both sides
     lambda x: np.pad(x, ((0, 0), (1, 1)), constant_values=-np.inf).reshape(4, 2, 4).max(2)),
    ("size=4x4 stride=4x4", "1,1", lambda x: x[:, :4].max().reshape(1, 1)),  # 2 columns cut
])
def test_hand_written_tiled_windows(window, out, want):
    g, _ = _lower(_window_module(window, out))
    ins = _rank_inputs(np.random.default_rng(1), [(4, 6)])
    (got,) = _run(g, ins)
    for r in range(RANKS):
        np.testing.assert_array_equal(got[r], want(ins[0][r]))


@pytest.mark.parametrize("window, out, dims, strides, base, wdil", [
    ("size=2x3 stride=1x3", "3,2", (2, 3), (1, 3), (1, 1), (1, 1)),            # overlapping
    ("size=2x3 stride=2x3 rhs_dilate=1x2", "2,1", (2, 3), (2, 3), (1, 1), (1, 2)),  # dilated window
])
def test_other_windows_are_their_window_maxima(window, out, dims, strides, base, wdil):
    """Windows that do not tile the operand: the maximum over window offsets of
    strided slices (dlverify/window_lowering.py), as lax.reduce_window computes."""
    g, _ = _lower(_window_module(window, out))
    ins = _rank_inputs(np.random.default_rng(1), [(4, 6)])
    (got,) = _run(g, ins)
    for r in range(RANKS):
        want = lax.reduce_window(ins[0][r], -np.inf, lax.max, dims, strides, "VALID",
                                 base_dilation=base, window_dilation=wdil)
        np.testing.assert_array_equal(got[r], np.asarray(want))


@pytest.mark.parametrize("window, out, init, error, what", [
    ("size=2x3 stride=2x3 lhs_dilate=2x1", "4,2", "-inf", InputError, "does not fit"),  # 3 rows
    ("size=2x3 stride=2x3", "2,2", "0", UnknownOpError, "identity"),   # 0 is not max's identity
])
def test_other_windows_are_errors_at_their_line(window, out, init, error, what):
    with pytest.raises(error) as e:
        _lower(_window_module(window, out, init))
    assert e.value.line == 12 and what in e.value.message and "\n" not in str(e.value)


# ------------------------------------------------ a reduction of tiles
def _red(b, kind, x, shape, axes):
    return b.op(kind, [x], shape, "float32", {"axes": axes})


def _check_same(g, ids):
    """Simplify; every output on every rank agrees with the original."""
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    ins = _rank_inputs(np.random.default_rng(2), [g.tensors[t].shape for t in g.inputs])
    for a, b in zip(_run(before, ins), _run(g, ins)):
        for r in range(RANKS):
            np.testing.assert_allclose(a[r], b[r], rtol=1e-5, atol=1e-5)
    return g


@pytest.mark.parametrize("split, inner_axes, mid, outer_axes, out, whole", [
    ((1, 1, 8, 2, 32), (1, 4), (1, 8, 2), (2,), (1, 8), True),     # size-1 dims in the split
    ((1, 8, 2, 32), (3,), (1, 8, 2), (2,), (1, 8), True),
    ((1, 1, 8, 2, 32), (2, 4), (1, 1, 2), (0, 1, 2), (), True),
    ((1, 8, 2, 32), (3,), (1, 8, 2), (1,), (1, 2), False),          # the 2 tiles stay apart
])
def test_a_reduction_of_tiles_is_the_reduction_of_the_operand(split, inner_axes, mid, outer_axes,
                                                              out, whole):
    def build(b, x):
        t = b.op("reshape", [x], split, "float32", {})
        return _red(b, "reduce_sum", _red(b, "reduce_sum", t, mid, inner_axes), out, outer_axes)
    g = _check_same(*_graph(build, [(1, 8, 64)]))
    reads_x = [op for op in g.ops if op.kind == "reduce_sum" and op.inputs == g.inputs]
    assert bool(reads_x) == whole


def _chain(g):
    """The reductions of g from its output down: (kind, axes, operand shape)."""
    producer = {op.output: op for op in g.ops}
    out, t = [], g.outputs[0]
    while t in producer:
        op = producer[t]
        out.append((op.kind, tuple(op.params.get("axes", ())), g.tensors[op.inputs[0]].shape))
        t = op.inputs[0]
    return out


def test_a_reduction_of_a_reduction_without_tiles_stays_two():
    """A vocabulary-parallel loss sums its shard, all-reduces, then sums the rest: the
    sequential inner sums stay values of their own."""
    def build(b, x):
        return _red(b, "reduce_sum", _red(b, "reduce_sum", x, (2, 8), (2,)), (), (0, 1))
    g = _check_same(*_graph(build, [(2, 8, 6)]))
    # (the outer sum as a chain of one-axis sums: tests/test_reduction_chains.py)
    assert _chain(g) == [("reduce_sum", (0,), (2,)), ("reduce_sum", (1,), (2, 8)),
                         ("reduce_sum", (2,), (2, 8, 6))]


def test_reductions_of_two_kinds_stay_apart():
    def build(b, x):
        return _red(b, "reduce_sum", _red(b, "reduce_max", x, (2, 8), (2,)), (), (0, 1))
    g = _check_same(*_graph(build, [(2, 8, 6)]))
    assert [k for k, _, _ in _chain(g)] == ["reduce_sum", "reduce_sum", "reduce_max"]


# ------------------------------------------------ size-1 dims and transposes (simplify_layouts)
def _op(b, kind, ins, shape, params=None):
    return b.op(kind, ins, shape, "float32", params or {})


def test_a_transpose_of_a_regrouping_reshape_moving_size_1_dims_is_one_reshape():
    """XLA's decoding q: [2, 8] split into [2, 2, 4, 1], the 1 moved before the 4."""
    def build(b, x):
        r = _op(b, "reshape", [x], (2, 2, 4, 1))
        return _op(b, "transpose", [r], (2, 2, 1, 4), {"permutation": (0, 1, 3, 2)})
    g = _check_same(*_graph(build, [(2, 8)]))
    assert [(op.kind, op.inputs) for op in g.ops] == [("reshape", g.inputs)]


def test_a_bitcast_between_layouts_is_one_reshape():
    """bitcast [2, 8, 32] -> [2, 8, 1, 32] between layouts {1,0,2} and {2,1,0,3}, lowered
    as transpose, reshape inserting a size-1 dim, transpose: the two transposes compose
    away."""
    def build(b, x):
        t = _op(b, "transpose", [x], (32, 2, 8), {"permutation": (2, 0, 1)})
        r = _op(b, "reshape", [t], (32, 2, 8, 1))
        return _op(b, "transpose", [r], (2, 8, 1, 32), {"permutation": (1, 2, 3, 0)})
    g = _check_same(*_graph(build, [(2, 8, 32)]))
    assert [(op.kind, op.inputs) for op in g.ops] == [("reshape", g.inputs)]


@pytest.mark.parametrize("case", ["sized_dims_swapped_after_a_split", "units_of_the_operand"])
def test_other_transposes_of_reshapes_stay(case):
    def build(b, x):
        if case == "units_of_the_operand":       # x's own size-1 dims: unit_dims_into_dot's
            r = _op(b, "reshape", [x], (1, 4, 4))
            return _op(b, "transpose", [r], (4, 1, 4), {"permutation": (1, 0, 2)})
        r = _op(b, "reshape", [x], (2, 2, 4))
        return _op(b, "transpose", [r], (2, 4, 2), {"permutation": (0, 2, 1)})
    shape = {"units_of_the_operand": (1, 4, 1, 4)}.get(case, (2, 8))
    g, ids = _graph(build, [shape])
    assert not simplify_graph(g, ids)


def _dot(b, lhs, rhs, shape, lc, rc, lb=(), rb=()):
    return _op(b, "dot_general", [lhs, rhs], shape,
               {"lhs_contract": lc, "rhs_contract": rc, "lhs_batch": lb, "rhs_batch": rb})


def test_a_free_size_1_dim_a_reshape_inserts_leaves_the_dot():
    """q = x @ w as [b, h, 1, e] times the cache [b, h, e, t]: the dot reads q as [b, h, e]
    and its [b, h, t] result is reshaped to [b, h, 1, t]."""
    def build(b, q, k):
        r = _op(b, "reshape", [q], (2, 2, 1, 4))
        return _dot(b, r, k, (2, 2, 1, 16), (3,), (2,), (0, 1), (0, 1))
    g = _check_same(*_graph(build, [(2, 8), (2, 2, 4, 16)]))
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert g.tensors[dot.inputs[0]].shape == (2, 2, 4) and g.tensors[dot.output].shape == (2, 2, 16)


def test_a_size_1_dim_the_dot_contracts_stays():
    def build(b, q, k):
        r = _op(b, "reshape", [q], (2, 2, 4, 1))
        return _dot(b, r, k, (2, 2, 4, 16), (3,), (2,), (0, 1), (0, 1))
    g = _check_same(*_graph(build, [(2, 8), (2, 2, 1, 16)]))
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert g.tensors[dot.inputs[0]].shape == (2, 2, 4, 1)


def test_a_transposed_dot_read_in_the_standard_order_is_split():
    """o = einsum('bhqk,bkhe->bqhe') as JAX writes it (v^T p^T: [b, h, e, q], transposed to
    [b, q, e, h]) read by a dot contracting (e, h) in that order: the dot takes the free
    dims' order ([b, h, q, e], as XLA's p v) and a transpose of the batch dim h is left,
    as on the side whose dot reads the value through a reshape."""
    def build(b, vt, p, wo):
        d = _dot(b, vt, p, (2, 3, 5, 4), (3,), (3,), (0, 1), (0, 1))
        t = _op(b, "transpose", [d], (2, 4, 5, 3), {"permutation": (0, 3, 2, 1)})
        return _dot(b, t, wo, (2, 4, 7), (2, 3), (0, 1))
    g = _check_same(*_graph(build, [(2, 3, 5, 6), (2, 3, 4, 6), (5, 3, 7)]))
    assert (2, 3, 4, 5) in [g.tensors[op.output].shape for op in g.ops if op.kind == "dot_general"]


# ------------------------------------------------ the compiled examples
def test_compiled_parallel_residual_verifies_and_its_twins_are_located(tmp_path):
    """XLA transposes the attention output for the (e, h) contraction it picks, flattens
    it and psums attention + MLP partials through a reshape: after the normal form the
    psum of the add is split (collective_sums.py) and both meet the sequential tree."""
    pr = example_module("parallel_residual")
    assert_compiled_case_and_twin(tmp_path, pr.parallel_residual_tp2(),
                                  pr.parallel_residual_bug_bias_in_psum(), dumped=True)
    for twin in (pr.parallel_residual_bug_mlp_unreduced(),
                 pr.parallel_residual_bug_residual_in_psum()):
        res = verify_texts(tmp_path, *compiled_pair(twin, dumped=True))
        assert not res.verified
        assert bug_line(twin.dist) in {fr.line for fr in res.failures[0].frames}


def test_compiled_parallel_residual_gradients_verify(tmp_path):
    """Every parameter's gradient: the backward attention's transposed dots (JAX's
    `v^T p^T` against XLA's `p v`, read as they are) reach one form; every derived
    view holds on random inputs."""
    pr = example_module("parallel_residual")
    res = verify_texts(tmp_path, *compiled_pair(pr.parallel_residual_grads_tp2(), dumped=True))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)


def test_compiled_kv_cache_decode_verifies_and_its_twins_are_located(tmp_path):
    kv = example_module("kv_cache_decode")
    assert_compiled_case_and_twin(tmp_path, kv.kv_cache_decode_tp2(),
                                  kv.kv_cache_bug_late_write(), dumped=True)
    twin = kv.kv_cache_bug_hides_token()
    res = verify_texts(tmp_path, *compiled_pair(twin, dumped=True))
    assert not res.verified and bug_line(twin.dist) in {fr.line for fr in res.failures[0].frames}
