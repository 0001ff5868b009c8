"""HLO scatter-add in the forms jax.grad of a gather emits (jnp.take's and
take_along_axis's transposes, point updates x.at[i, j].add(u)), before and
after XLA's optimisations (which turn batching dims into iota index columns):
translated to the one-hot contraction of frontends/hlo/ops/scatter.py, they
compute, by the shared evaluator, what JAX computes, with repeated and
out-of-range indices; other combiners and forms are one-line errors naming
the scatter's line."""
# XLA_FLAGS (8 host devices): tests/conftest.py
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from test_hlo_argmax_cumsum import hlo_text, lower, run  # noqa: E402

from dlverify.errors import UnknownOpError  # noqa: E402


def _vjp(f):
    """The transpose of gather f(w, i) at cotangent g: a scatter-add into zeros."""
    return lambda w, i, g: jax.linear_transpose(lambda v: f(v, i), w)(g)[0]


# (function of (w, i, g), shapes of w, i, g); indices repeat and leave the range
FUNCTIONS = {
    "take_rows": (_vjp(lambda w, i: jnp.take(w, i, axis=0)), (6, 4), (7,), (7, 4)),
    "take_cols": (_vjp(lambda w, i: jnp.take(w, i, axis=1)), (3, 6), (5,), (3, 5)),
    "take_along_axis": (_vjp(lambda w, i: jnp.take_along_axis(w, i, axis=1)),
                        (5, 6), (5, 2), (5, 2)),
    "embedding_rows": (_vjp(lambda w, i: w[i]), (6, 3), (4, 2), (4, 2, 3)),
    "add_at_points": (lambda w, i, g: w.at[i[:, 0], i[:, 1]].add(g), (6, 6), (5, 2), (5,)),
}


def inputs(name):
    _, ws, is_, gs = FUNCTIONS[name]
    rng = np.random.default_rng(2)
    w = rng.standard_normal(ws).astype(np.float32)
    i = rng.integers(0, 6, is_).astype(np.int32)
    i.reshape(-1)[:2] = i.reshape(-1)[2]        # a repeated index accumulates
    i.reshape(-1)[-1] = 9                        # out of range: dropped (mode fill)
    g = rng.standard_normal(gs).astype(np.float32)
    return w, i, g


@pytest.mark.parametrize("stage", ["pre", "post"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_jax_scatter_adds_compute_what_xla_computes(name, stage):
    fn = FUNCTIONS[name][0]
    args = inputs(name)
    text = hlo_text(fn, *args, stage=stage)
    g, info = lower(text)
    if " scatter(" in text:
        assert any("out of bounds is dropped" in n for n in info.assumptions)
    (got,), want = run(g, *args), np.asarray(jax.jit(fn)(*args))
    # the evaluator contracts in float64; the declared type is XLA's
    assert got.shape == want.shape and g.tensors[g.outputs[0]].dtype == str(want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_the_bench_forms_are_scatters():
    """Before optimisations every function here is one HLO scatter (the test
    above would pass vacuously otherwise)."""
    for name, (fn, *_rest) in FUNCTIONS.items():
        assert " scatter(" in hlo_text(fn, *inputs(name), stage="pre"), name


MODULE = """HloModule m

%comb (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] BODY
}

ENTRY %main (x: f32[6,4], i: s32[3,1], u: f32[3,UW]) -> f32[6,4] {
  %x = f32[6,4] parameter(0)
  %i = s32[3,1] parameter(1)
  %u = f32[3,UW] parameter(2)
  ROOT %s = f32[6,4] scatter(%x, %i, %u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%comb
}
"""


@pytest.mark.parametrize("body, uw, what", [
    ("multiply(%a, %b)", "4", "not known before run time"),
    ("maximum(%a, %b)", "4", "not known before run time"),
    ("add(%a, %b)", "2", "partial windows"),     # a window of 2 of the 4 columns
])
def test_other_scatters_are_unknown_ops_at_their_line(body, uw, what):
    text = MODULE.replace("BODY", body).replace("UW", uw)
    with pytest.raises(UnknownOpError) as e:
        lower(text)
    assert e.value.line == 13 and what in e.value.message and "\n" not in str(e.value)


def test_scatter_add_at_known_in_range_indices_has_no_assumption():
    text = MODULE.replace("BODY", "add(%a, %b)").replace("UW", "4").replace(
        "%i = s32[3,1] parameter(1)", "%p = s32[3,1] parameter(1)\n  %i = s32[3,1] constant({ {0}, {5}, {0} })")
    g, info = lower(text)
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    u = np.ones((3, 4), np.float32)
    (got,) = run(g, x, np.zeros((3, 1), np.int32), u)
    want = x.copy()
    want[0] += 2
    want[5] += 1
    assert np.array_equal(got, want) and not info.assumptions


@pytest.mark.parametrize("name", ["top_k", "sort"])
def test_jaxpr_gradients_of_top_k_and_sort_are_one_hot_contractions(name):
    """jax.grad of lax.top_k (MoE routing) and jnp.sort scatter-adds the cotangent
    back along the sorted axis at indices the forward computed, promised in bounds:
    the jaxpr frontend's one-hot contraction computes what JAX computes."""
    from jax import lax
    from test_conv import _assert_like_jax, _from_jaxpr

    weights = jnp.arange(16, dtype=jnp.float32)
    fn = {"top_k": jax.grad(lambda x: jnp.sum(lax.top_k(x, 3)[0] * weights[:3])),
          "sort": jax.grad(lambda x: jnp.sum(jnp.sort(x, axis=-1) * weights))}[name]
    x = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
    assert "PROMISE_IN_BOUNDS" in str(jax.make_jaxpr(fn)(x))
    g = _from_jaxpr(fn, (x,))
    assert not any(op.kind.startswith("scatter") for op in g.ops)
    _assert_like_jax(g, fn, (x,))


@pytest.mark.parametrize("stage", ["pre", "post"])
def test_top_k_gradient_as_written_computes_what_xla_computes(stage):
    """jax.grad of top_k: a scatter-add with a batching dim (the rows) at the chosen
    columns, promised in bounds, as JAX writes it; after optimisations XLA flattens
    its index batch dims ([n*k, 2] a reshape of [n, k, 2]: an iota column of the
    rows beside the chosen columns), which the frontend splits back so that the rows
    are a batch dim of the contraction again."""
    from jax import lax

    def fn(x, g):
        return jax.vjp(lambda v: lax.top_k(v, 2)[0], x)[1](g)[0]
    rng = np.random.default_rng(7)
    x, g = (rng.standard_normal(s).astype(np.float32) for s in ((4, 6), (4, 2)))
    text = hlo_text(fn, x, g, stage=stage)
    if stage == "post":   # the flattened form this test is about
        assert "s32[4,2,2]{2,1,0} concatenate(" in text and "scatter(" in text
    graph, _ = lower(text)
    dots = [op for op in graph.ops if op.kind == "dot_general"]
    assert len(dots) == 1 and dots[0].params["lhs_batch"] == (0,)   # the rows batched
    (got,), want = run(graph, x, g), np.asarray(jax.jit(fn)(x, g))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


FLAT = """HloModule m

%comb (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

ENTRY %main (x: f32[4,6], c: s32[XS], u: f32[UF,1,1]) -> f32[4,6] {
  %x = f32[4,6] parameter(0)
  %c = s32[XS] parameter(1)
  %u = f32[UF,1,1] parameter(2)
  %r = s32[XS] iota(), iota_dimension=ID
  %cat = s32[XC] concatenate(%r, %c), dimensions={CD}
  %i = s32[UF,2] reshape(%cat)
  ROOT %s = f32[4,6] scatter(%x, %i, %u), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=%comb
}
"""


def _flat_scatter_add(x, i, u):
    """What XLA computes: u[s] added at i[s] (an index out of range dropped)."""
    out = x.astype(np.float64)
    for s in range(i.shape[0]):
        r, c = i[s]
        if 0 <= r < out.shape[0] and 0 <= c < out.shape[1]:
            out[r, c] += u[s, 0, 0]
    return out


@pytest.mark.parametrize("xs, iota_dim, batched", [
    ((4, 3, 1), 0, True),      # top_k's form after optimisations: the rows an iota
    ((4, 1, 3, 1), 0, True),   # a size-1 dim between: split into [4, 3] only
    ((2, 6, 1), 1, False),     # an iota of size 6 along the index batch: no operand dim of 4
    ((4, 3, 1), 1, False),     # an iota over the k chosen, not the rows: a one-hot stays
])
def test_flattened_index_batch_dims_are_split_where_an_iota_column_lies(xs, iota_dim, batched):
    """A scatter at indices [n*k, 2] reshaped from [n, k, 2] (the concatenation of an
    iota and data indices): split back to [n, k] it pairs every index vector with the
    same update, so it computes the same (shared evaluator against a direct scatter,
    repeated and out-of-range indices included), and the rows become a batch dim of
    the contraction only where the iota runs over them."""
    n = int(np.prod(xs))
    cat = xs[:-1] + (2,)
    text = (FLAT.replace("XS", ",".join(map(str, xs))).replace("XC", ",".join(map(str, cat)))
            .replace("UF", str(n)).replace("ID", str(iota_dim)).replace("CD", str(len(xs) - 1)))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    c = rng.integers(0, 6, xs).astype(np.int32)
    c.reshape(-1)[:2] = c.reshape(-1)[2]      # repeated: accumulates
    c.reshape(-1)[-1] = 7                     # out of range: dropped
    u = rng.standard_normal((n, 1, 1)).astype(np.float32)
    g, _ = lower(text)
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    assert bool(dot.params["lhs_batch"]) == batched
    iota = np.broadcast_to(np.arange(xs[iota_dim]).reshape(
        [-1 if d == iota_dim else 1 for d in range(len(xs))]), xs)
    want = _flat_scatter_add(x, np.concatenate([iota, c], axis=-1).reshape(n, 2), u)
    (got,) = run(g, x, c, u)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
