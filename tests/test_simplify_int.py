"""XLA's integer rem / div by powers of two, known-bool operands, canonical gathers
and size-1 reshapes of all-reduces, folded back (dlverify/simplify_int.py): each
rewrite leaves the outputs unchanged on random and edge-case data (the shared
evaluator, XLA's integer semantics), fires where it should and not elsewhere;
then the compiled vocab-parallel examples verify and their twins are located."""
import copy

import jax
import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, example_module

from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.simplify_int import fold_int_expansions


def _graph(build, inputs):
    """inputs: (shape, dtype) per input."""
    ids = IdAllocator()
    g = Graph("g")
    b = GraphBuilder(g, ids)
    xs = [b.tensor(s, d, f"in{i}") for i, (s, d) in enumerate(inputs)]
    g.inputs = list(xs)
    g.outputs = [build(b, *xs)]
    return g, ids


def _splat(b, value, shape, dtype):
    c = b.constant(np.asarray(value, dtype=dtype), (), dtype)
    return b.op("broadcast_in_dim", [c], shape, dtype, {"broadcast_dimensions": ()}) if shape else c


def _run(g, ins, ranks=1):
    vals = Interpreter(g, ranks).run([list(x) if ranks > 1 else [x] for x in ins])
    return [vals[t] for t in g.outputs]


def _check(build, inputs, samples, fires=True, ranks=1):
    """Fold; the outputs agree with the original's, bit for bit, on every sample (a
    list of per-input arrays, or per-input per-rank lists when ranks > 1)."""
    g, ids = _graph(build, inputs)
    before = copy.deepcopy(g)
    assert fold_int_expansions(g, ids, None) == fires
    for ins in samples:
        for a, b in zip(_run(before, ins, ranks), _run(g, ins, ranks)):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
    return g


def _edge_ints(dtype, n, rng):
    info = np.iinfo(dtype)
    edge = [info.min, info.min + 1, -9, -8, -7, -4, -3, -1, 0, 1, 3, 4, 5, 7, 8, 9, info.max - 1, info.max]
    rand = rng.integers(info.min, info.max, size=n, endpoint=True)
    return np.concatenate([np.asarray(edge, dtype=dtype), rand.astype(dtype)])


def _signed_pow2(inner_kind, lit, dtype, *, same_test=True, swap=False):
    """XLA's expansion: select(x < 0, -q, q) with q = |x| <inner_kind> lit."""
    def build(b, x):
        shape = b.graph.tensors[x].shape
        zero = _splat(b, 0, shape, dtype)
        neg_test = b.op("lt", [x, zero], shape, "bool")
        absx = b.op("select_n", [neg_test, x, b.op("neg", [x], shape, dtype)], shape, dtype)
        q = b.op(inner_kind, [absx, _splat(b, lit, shape, dtype)], shape, dtype)
        test2 = neg_test if same_test else b.op("lt", [x, _splat(b, 0, shape, dtype)], shape, "bool")
        cases = [q, b.op("neg", [q], shape, dtype)]
        return b.op("select_n", [test2] + (cases[::-1] if swap else cases), shape, dtype)
    return build


@pytest.mark.parametrize("dtype", ["int32", "int8", "int64"])
@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_signed_rem_and_div_by_a_power_of_two_fold_back(dtype, k):
    rng = np.random.default_rng(k)
    xs = _edge_ints(dtype, 200, rng)
    for kind, lit, op in (("and", (1 << k) - 1, "rem"), ("shift_right_logical", k, "div")):
        for same in (True, False):   # the sign test computed once or twice
            g = _check(_signed_pow2(kind, lit, dtype, same_test=same), [(xs.shape, dtype)], [[xs]])
            kinds = [o.kind for o in g.ops]
            assert op in kinds and "select_n" not in kinds and "neg" not in kinds, kinds
    # the folded ops are XLA's truncating rem / div
    g = _check(_signed_pow2("and", (1 << k) - 1, dtype), [(xs.shape, dtype)], [[xs]])
    got = _run(g, [xs])[0][0]
    want = np.fmod(xs.astype(np.int64), 1 << k).astype(dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["int32", "int8"])
def test_largest_divisors_that_fit(dtype):
    bits = np.iinfo(dtype).bits
    xs = _edge_ints(dtype, 100, np.random.default_rng(1))
    _check(_signed_pow2("and", (1 << (bits - 2)) - 1, dtype), [(xs.shape, dtype)], [[xs]])
    _check(_signed_pow2("shift_right_logical", bits - 2, dtype), [(xs.shape, dtype)], [[xs]])
    # 2^(bits-1) is no value of the dtype: no rem / div by it to fold into
    _check(_signed_pow2("and", np.iinfo(dtype).max, dtype), [(xs.shape, dtype)], [[xs]], fires=False)
    _check(_signed_pow2("shift_right_logical", bits - 1, dtype), [(xs.shape, dtype)], [[xs]], fires=False)


@pytest.mark.parametrize("build", [
    _signed_pow2("and", 5, "int32"),                   # not 2^k - 1
    _signed_pow2("and", -1, "int32"),
    _signed_pow2("and", 3, "int32", swap=True),        # select(x < 0, q, -q): not a rem
    _signed_pow2("shift_right_logical", 2, "int32", swap=True),
    _signed_pow2("shift_right_logical", -1, "int32"),
])
def test_other_sign_fixes_stay(build):
    xs = _edge_ints("int32", 50, np.random.default_rng(2))
    _check(build, [(xs.shape, "int32")], [[xs]], fires=False)


def test_sign_test_of_another_value_stays():
    def build(b, x, y):
        shape = b.graph.tensors[x].shape
        zero = _splat(b, 0, shape, "int32")
        absx = b.op("select_n", [b.op("lt", [x, zero], shape, "bool"), x, b.op("neg", [x], shape, "int32")],
                    shape, "int32")
        q = b.op("and", [absx, _splat(b, 3, shape, "int32")], shape, "int32")
        return b.op("select_n", [b.op("lt", [y, zero], shape, "bool"), q, b.op("neg", [q], shape, "int32")],
                    shape, "int32")
    rng = np.random.default_rng(3)
    xs, ys = _edge_ints("int32", 30, rng), _edge_ints("int32", 30, rng)[::-1].copy()
    _check(build, [(xs.shape, "int32"), (ys.shape, "int32")], [[xs, ys]], fires=False)


@pytest.mark.parametrize("kind, value, fires", [
    ("ne", False, True), ("eq", True, True), ("and", True, True), ("or", False, True),
    ("ne", True, True), ("eq", False, True), ("and", False, False), ("or", True, False),
])
def test_known_bool_operands(kind, value, fires):
    """ne(p, V < 0) with V < 0 computed from literals (the floor-mod fix-up)."""
    def build(b, x):
        shape = b.graph.tensors[x].shape
        p = b.op("lt", [x, _splat(b, 0, shape, "int32")], shape, "bool")
        v = b.constant(np.asarray(-4 if value else 4, dtype=np.int32), (), "int32")
        known = b.op("lt", [v, b.constant(np.asarray(0, dtype=np.int32), (), "int32")], (), "bool")
        known = b.op("broadcast_in_dim", [known], shape, "bool", {"broadcast_dimensions": ()})
        return b.op(kind, [known, p], shape, "bool")
    xs = _edge_ints("int32", 30, np.random.default_rng(4))
    g = _check(build, [(xs.shape, "int32")], [[xs]], fires=fires)
    if fires:
        assert kind not in [o.kind for o in g.ops if g.tensors[o.output].shape == xs.shape]


@pytest.mark.parametrize("floor_mod", [True, False])
def test_select_on_a_decided_mask_is_its_case(floor_mod):
    """jnp.take's fill select on the in-bounds mask of `x % 4`, XLA's floor mod (rem
    and its sign fix-up, proved in [0, 4) by the index ranges): the gathered case.
    The bare rem may be negative: the mask is not decided and the select stays."""
    def build(b, x, y):
        shape = b.graph.tensors[x].shape
        zero, four = _splat(b, 0, shape, "int32"), _splat(b, 4, shape, "int32")
        i = b.op("rem", [x, four], shape, "int32")
        if floor_mod:
            neg = b.op("lt", [i, zero], shape, "bool")
            i = b.op("select_n", [neg, i, b.op("add", [i, four], shape, "int32")], shape, "int32")
        ok = b.op("and", [b.op("ge", [i, zero], shape, "bool"), b.op("lt", [i, four], shape, "bool")],
                  shape, "bool")
        return b.op("select_n", [ok, _splat(b, np.nan, shape, "float32"), y], shape, "float32")
    rng = np.random.default_rng(12)
    xs = _edge_ints("int32", 20, rng)
    if not floor_mod:
        xs = np.abs(xs[2:])   # (the sample takes no NaN: NaN != NaN)
    ys = rng.standard_normal(xs.shape).astype(np.float32)
    g = _check(build, [(xs.shape, "int32"), (xs.shape, "float32")], [[xs, ys]])
    selects = [o for o in g.ops if o.kind == "select_n" and g.tensors[o.output].dtype == "float32"]
    assert bool(selects) != floor_mod


GATHER = dict(operand_batching_dims=(), start_indices_batching_dims=(), indices_are_sorted=False)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_canonical_take_folds_into_jax_form(dim):
    """XLA's take: the unit slice dim kept, batch dims first (offset_dims after them)."""
    o_shape, n = (3, 4, 2), 5

    def build(b, x, i):
        slices = tuple(1 if d == dim else o_shape[d] for d in range(3))
        out = (n,) + slices
        return b.op("gather", [x, i], out, "float32",
                    dict(GATHER, offset_dims=(1, 2, 3), collapsed_slice_dims=(), start_index_map=(dim,),
                         index_vector_dim=1, slice_sizes=slices))
    rng = np.random.default_rng(dim)
    samples = []
    for _ in range(3):   # out-of-range indices too: both forms clamp the start alike
        idx = rng.integers(-3, o_shape[dim] + 3, size=(n, 1)).astype(np.int32)
        samples.append([rng.standard_normal(o_shape).astype(np.float32), idx])
    g = _check(build, [(o_shape, "float32"), ((n, 1), "int32")], samples)
    gathers = [o for o in g.ops if o.kind == "gather"]
    assert len(gathers) == 1 and gathers[0].params["collapsed_slice_dims"] == (dim,)


def _flattened_take(dim, ids_shape, via_row=True, back=True):
    """XLA's lookup after its gather simplifier: the ids' dims flattened into one batch
    dim (through a [1, n] bitcast when via_row), the unit slice dim kept, and (back)
    the output reshaped to the ids' dims."""
    o_shape, n = (3, 4, 2), int(np.prod(ids_shape))

    def build(b, x, ids):
        flat = b.op("reshape", [ids], (1, n), "int32") if via_row else ids
        i = b.op("reshape", [flat], (n, 1), "int32")
        slices = tuple(1 if d == dim else o_shape[d] for d in range(3))
        g = b.op("gather", [x, i], (n,) + slices, "float32",
                 dict(GATHER, offset_dims=(1, 2, 3), collapsed_slice_dims=(), start_index_map=(dim,),
                      index_vector_dim=1, slice_sizes=slices))
        if not back:
            return g
        rest = tuple(o_shape[d] for d in range(3) if d != dim)
        return b.op("reshape", [g], ids_shape + rest, "float32")
    return build, o_shape


@pytest.mark.parametrize("dim", [0, 1, 2])
@pytest.mark.parametrize("ids_shape", [(2, 3), (2, 1, 3), (6, 1)])
@pytest.mark.parametrize("via_row", [False, True])
def test_a_take_at_flattened_ids_is_the_take_at_the_ids_reshaped(dim, ids_shape, via_row):
    """take(x, reshape(ids, [n, 1])) = reshape(take(x, ids[..., None])): the same row
    at every position of the row-major batch block (out-of-range ids clamped alike); the
    reshape back to the ids' dims then cancels (a lookup at the first dim only: the
    batch block leads, so the output reshape is the batch block's)."""
    build, o_shape = _flattened_take(dim, ids_shape, via_row, back=dim == 0)
    rng = np.random.default_rng(12 + dim)
    samples = [[rng.standard_normal(o_shape).astype(np.float32),
                rng.integers(-3, o_shape[dim] + 3, size=ids_shape).astype(np.int32)] for _ in range(3)]
    g = _check(build, [(o_shape, "float32"), (ids_shape, "int32")], samples)
    (gather,) = [o for o in g.ops if o.kind == "gather"]
    batch = ids_shape[:-1] if ids_shape[-1] == 1 else ids_shape
    assert g.tensors[gather.inputs[1]].shape == batch + (1,)
    assert gather.params["collapsed_slice_dims"] == (dim,)
    if dim == 0 and batch == ids_shape:   # the reshapes cancel: the lookup is the output
        assert g.outputs == [gather.output]


@pytest.mark.parametrize("ids_shape", [(6,), (1, 6)])
def test_a_take_at_ids_with_size_1_dims_only_added_keeps_its_batch(ids_shape):
    """Ids [6] or [1, 6] read as [6, 1]: no sized dim regrouped (size-1 dims are
    gather_batching.py's concern), the lookup keeps its batch dim."""
    build, o_shape = _flattened_take(0, ids_shape, via_row=False)
    rng = np.random.default_rng(15)
    samples = [[rng.standard_normal(o_shape).astype(np.float32),
                rng.integers(0, 3, size=ids_shape).astype(np.int32)]]
    g = _check(build, [(o_shape, "float32"), (ids_shape, "int32")], samples)
    (gather,) = [o for o in g.ops if o.kind == "gather"]
    assert g.tensors[gather.inputs[1]].shape == (6, 1)


def _along(o_shape, iota_dim_size=None, iota_dim=0):
    """XLA's take_along_axis of the last dim: index columns (iota over the batch, j)."""
    m = o_shape[0]
    bsz = iota_dim_size or m

    def build(b, x, j):
        io = b.op("iota", [], (bsz, 1, 1), "int32", {"dimension": iota_dim})
        j3 = b.op("reshape", [j], (bsz, 1, 1), "int32")
        cat = b.op("concatenate", [io, j3], (bsz, 1, 2), "int32", {"dimension": 2})
        idx = b.op("reshape", [cat], (bsz, 2), "int32")
        return b.op("gather", [x, idx], (bsz, 1, 1), "float32",
                    dict(GATHER, offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1),
                         index_vector_dim=1, slice_sizes=(1, 1)))
    return build, bsz


def test_the_evaluator_gathers_along_batching_dims_as_take_along_axis():
    """JAX's take_along_axis form (its params as jax lowers them): numpy's
    take_along_axis of the clamped indices."""
    def build(b, x, j):
        return b.op("gather", [x, j], (6, 3), "float32",
                    dict(GATHER, offset_dims=(), collapsed_slice_dims=(1,), start_index_map=(1,),
                         operand_batching_dims=(0,), start_indices_batching_dims=(0,),
                         index_vector_dim=2, slice_sizes=(1, 1)))
    g, _ = _graph(build, [((6, 5), "float32"), ((6, 3, 1), "int32")])
    rng = np.random.default_rng(9)
    x, j = rng.standard_normal((6, 5)).astype(np.float32), rng.integers(-3, 9, size=(6, 3, 1)).astype(np.int32)
    want = np.take_along_axis(x, np.clip(j[..., 0], 0, 4), axis=1)
    np.testing.assert_array_equal(_run(g, [x, j])[0][0], want)


def test_canonical_take_along_axis_folds_into_batching_form():
    o_shape = (6, 5)
    build, m = _along(o_shape)
    rng = np.random.default_rng(5)
    samples = [[rng.standard_normal(o_shape).astype(np.float32),
                rng.integers(-2, 8, size=(m,)).astype(np.int32)] for _ in range(3)]
    g = _check(build, [(o_shape, "float32"), ((m,), "int32")], samples)
    gathers = [o for o in g.ops if o.kind == "gather"]
    assert len(gathers) == 1 and gathers[0].params["operand_batching_dims"] == (0,)


@pytest.mark.parametrize("size, iota_dim", [(4, 0), (8, 0), (6, 1)])
def test_take_along_axis_whose_iota_is_not_the_batch_stays(size, iota_dim):
    """An iota over fewer or more rows than the operand has (clamped, or not every row),
    or along a size-1 dim (all zeros): not a batching dim."""
    o_shape = (6, 5)
    build, m = _along(o_shape, size, iota_dim)
    rng = np.random.default_rng(6)
    samples = [[rng.standard_normal(o_shape).astype(np.float32),
                rng.integers(0, 5, size=(m,)).astype(np.int32)]]
    _check(build, [(o_shape, "float32"), ((m,), "int32")], samples, fires=False)


@pytest.mark.parametrize("reducer", ["sum", "max"])
@pytest.mark.parametrize("shape", [(8, 1), (2, 4)])
def test_all_reduce_between_a_reshape_and_its_inverse_reduces_the_operand(reducer, shape):
    def build(b, x):
        r = b.op("reshape", [x], shape, "float32")
        ar = b.op("all_reduce", [r], shape, "float32", {"reducer": reducer, "groups": [[0, 1]]})
        return b.op("reshape", [ar], (8,), "float32")
    rng = np.random.default_rng(7)
    samples = [[[rng.standard_normal(8).astype(np.float32) for _ in range(2)]] for _ in range(3)]
    g = _check(build, [((8,), "float32")], samples, ranks=2)
    assert [o.kind for o in g.ops] == ["all_reduce"]


@pytest.mark.parametrize("before", [False, True])
def test_a_lone_reshape_of_all_reduce_stays(before):
    """Without the inverse reshape on the other side (or back to another shape), the
    reshape stays where the program put it."""
    def build(b, x):
        src = b.op("reshape", [x], (8, 1), "float32") if before else x
        ar = b.op("all_reduce", [src], b.graph.tensors[src].shape, "float32",
                  {"reducer": "sum", "groups": [[0, 1]]})
        return b.op("reshape", [ar], (2, 4), "float32")
    rng = np.random.default_rng(8)
    _check(build, [((8,), "float32")], [[[rng.standard_normal(8).astype(np.float32)] * 2]],
           fires=False, ranks=2)


def test_whole_slice_is_its_operand():
    def build(b, x):
        s = b.op("slice", [x], (8, 1), "int32", {"start_indices": (0, 0), "limit_indices": (8, 1),
                                                  "strides": None})
        return b.op("add", [s, s], (8, 1), "int32")
    xs = _edge_ints("int32", 0, np.random.default_rng(10))[:8].reshape(8, 1)
    g = _check(build, [((8, 1), "int32")], [[xs]])
    assert "slice" not in [o.kind for o in g.ops]
    _check(lambda b, x: b.op("slice", [x], (4, 1), "int32", {
        "start_indices": (4, 0), "limit_indices": (8, 1), "strides": None}), [((8, 1), "int32")],
        [[xs]], fires=False)


def test_compiled_take_along_axis_transpose_batches_its_iota_column():
    """XLA's scatter-add with an iota index column (take_along_axis's transpose after
    optimisations) is lowered with that column as a batch dim of the one-hot
    contraction; it computes what JAX computes (evaluator vs jax, with repeated
    and out-of-range indices)."""
    from test_hlo_scatter_add import _vjp, hlo_text, lower, run
    fn = _vjp(lambda w, i: jax.numpy.take_along_axis(w, i, axis=1))   # one pick per row
    rng = np.random.default_rng(11)
    i = rng.integers(0, 6, (5, 1)).astype(np.int32)
    i[-1, 0] = 9                                                        # out of range: dropped
    args = (rng.standard_normal((5, 6)).astype(np.float32), i,
            rng.standard_normal((5, 1)).astype(np.float32))
    text = hlo_text(fn, *args, stage="post")
    assert "iota" in text and " scatter(" in text
    g, _ = lower(text)
    assert any(o.kind == "dot_general" and o.params["lhs_batch"] for o in g.ops)
    (got,), want = run(g, *args), np.asarray(jax.jit(fn)(*args))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ compiled examples

def test_compiled_vocab_parallel_embedding_verifies_and_its_mask_twin_is_located(tmp_path):
    vp = example_module("vocab_parallel")
    assert_compiled_case_and_twin(tmp_path, vp.vocab_parallel_embedding_xent(),
                                  vp.vocab_parallel_bug_embedding_mask_off_by_one(), dumped=True)


def test_compiled_jit_sharded_embedding_verifies_and_its_shifted_ids_twin_is_located(tmp_path):
    # examples/gspmd_jit.py: XLA flattens the ids [4, 8] of the masked lookup into [32, 1]
    gj = example_module("gspmd_jit")
    assert_compiled_case_and_twin(tmp_path, gj.gspmd_vocab_parallel_embedding(),
                                  gj.gspmd_vocab_parallel_embedding_shifted_ids_bug())


def test_compiled_vocab_parallel_gradients_verify_and_the_target_twin_is_located(tmp_path):
    vp = example_module("vocab_parallel")
    assert_compiled_case_and_twin(tmp_path, vp.vocab_parallel_grads(),
                                  vp.vocab_parallel_bug_target_logit_not_reduced(), dumped=True)


def test_compiled_top_k_router_gradient_verifies_and_the_psum_twin_is_located(tmp_path):
    """After optimisations XLA scatters top_k's gradient at indices [n*k, 2], a reshape
    of the rows' iota beside the chosen experts [n, k, 2]: split back into [n, k]
    (frontends/hlo/ops/scatter.py) the rows are a batch dim again, whose block each
    rank holds (its local iota alone is no block of the sequential one)."""
    moe = example_module("moe_router_grad")
    assert_compiled_case_and_twin(tmp_path, moe.moe_top2_router_grad_dp(),
                                  moe.moe_top2_router_grad_bug_psum())
