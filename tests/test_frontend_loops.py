"""Loops and conditionals of the jaxpr frontend (frontends/jaxpr/loops.py):
the unrolled IR computes what JAX computes (run by the shared interpreter on
random data), stacks built by one scan are read row by row by the next, and
loops that cannot be unrolled are refused at their line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.errors import UnknownOpError
from dlverify.frontends.jaxpr import Ctx, walk
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator


def _export(fn, args):
    closed = jax.make_jaxpr(fn)(*args)
    g = Graph("probe")
    b = GraphBuilder(g, IdAllocator())
    g.inputs = [b.tensor(np.shape(a), str(np.asarray(a).dtype)) for a in args]
    g.outputs = walk(Ctx(b, None, False), closed, g.inputs)
    return g


def _check_like_jax(fn, *args):
    g = _export(fn, args)
    vals = Interpreter(g, 1).run([[a] for a in args])
    want = jax.tree.leaves(jax.jit(fn)(*args))
    assert len(want) == len(g.outputs)
    for t, w in zip(g.outputs, want):
        np.testing.assert_allclose(np.asarray(vals[t][0], dtype=np.float64),
                                   np.asarray(w, dtype=np.float64), rtol=1e-5, atol=1e-5)
    return g


RNG = np.random.default_rng(0)
W = RNG.standard_normal((3, 4, 4)).astype(np.float32)
X = RNG.standard_normal((2, 4)).astype(np.float32)


def test_scan_with_consts_carry_xs_and_stacked_outputs():
    bias = RNG.standard_normal((4,)).astype(np.float32)

    def f(w, x, b):
        def body(c, wi):
            h = jnp.tanh(c @ wi + b)
            return h, (h.sum(axis=0), c * 2.0)
        return lax.scan(body, x, w)
    g = _check_like_jax(f, W, X, bias)
    assert sum(op.kind == "dot_general" for op in g.ops) == 3  # one per iteration


@pytest.mark.parametrize("reverse", [False, True])
def test_reversed_scan_and_stacks_read_row_by_row(reverse):
    def f(w, x):
        c, ys = lax.scan(lambda c, wi: (c @ wi, c), x, w, reverse=reverse)
        back, zs = lax.scan(lambda c, y: (c + y, c * y), c, ys, reverse=True)
        return c, ys, back, zs
    g = _check_like_jax(f, W, X)
    prod = g.producer()
    # the second scan reads the rows the first produced, not slices of their stack
    slices_of_stacks = [op for op in g.ops if op.kind == "slice"
                        and prod.get(op.inputs[0]) is not None
                        and prod[op.inputs[0]].kind == "concatenate"]
    assert slices_of_stacks == []


def test_gradient_through_scan_matches_jax():
    def loss(w, x):
        return jnp.sum(lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0] ** 2)
    _check_like_jax(jax.grad(loss, argnums=(0, 1)), W, X)


def test_scan_of_length_zero_returns_the_carry_and_empty_stacks():
    def f(x):
        return lax.scan(lambda c, _: (c + 1.0, c), x, None, length=0)
    _check_like_jax(f, X)


def test_fori_loop_and_nested_scans():
    def f(w, x):
        def outer(i, c):
            inner = lax.scan(lambda h, wi: (jnp.sin(h @ wi), None), c, w)[0]
            return inner * (i + 1).astype(jnp.float32)
        return lax.fori_loop(0, 2, outer, x)
    _check_like_jax(f, W, X)


def test_while_loop_with_a_counter_is_unrolled_to_its_trip_count():
    def f(x):
        def body(s):
            i, c = s
            return i + 2, c * 1.5 + i.astype(jnp.float32)
        return lax.while_loop(lambda s: s[0] < 7, body, (jnp.int32(1), x))
    g = _check_like_jax(f, X)
    assert sum(op.kind == "mul" for op in g.ops) == 3  # i = 1, 3, 5
    # the condition's ops are not left in the program
    assert not any(op.kind == "lt" for op in g.ops)


def test_while_loop_on_data_is_refused_at_its_line():
    def f(x):
        return lax.while_loop(lambda c: jnp.sum(c) < 100.0, lambda c: c * 2.0, x)
    with pytest.raises(UnknownOpError, match="while loop whose condition is not known") as e:
        _export(f, (X,))
    assert e.value.file.endswith("test_frontend_loops.py") and e.value.line > 0


@pytest.mark.parametrize("p", [-3, 0, 1, 5])
def test_cond_and_switch_on_data_select_the_branch_elementwise(p):
    def f(x, p):
        a = lax.cond(p > 0, lambda v: v * 2.0, lambda v: jnp.exp(v), x)
        b = lax.switch(p, [lambda v: v + 1.0, lambda v: v - 1.0, lambda v: -v], x)
        return a, b
    g = _check_like_jax(f, X, np.int32(p))
    assert any(op.kind == "select_n" for op in g.ops)


def test_cond_with_a_known_index_is_its_branch():
    def f(x):
        return lax.cond(True, lambda v: v * 2.0, lambda v: jnp.exp(v), x)
    g = _check_like_jax(f, X)
    assert not any(op.kind in ("select_n", "exp") for op in g.ops)


def test_cond_on_the_rank_with_a_collective_in_a_branch_is_refused():
    mesh = dlverify.host_mesh((2,), ("tp",))

    def loc(x):
        return lax.cond(lax.axis_index("tp") == 0, lambda v: lax.psum(v, "tp"), lambda v: v, x)
    dist = jax.jit(jax.shard_map(loc, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False))
    with pytest.raises(UnknownOpError, match="branches hold collectives"):
        dlverify.verify_jax(lambda x: x, dist, jax.ShapeDtypeStruct((2, 4), jnp.float32))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_stack_is_a_concatenate_of_reshapes(axis):
    def f(a, b, c):
        return jnp.stack([a, b, c], axis=axis)
    _check_like_jax(f, X, X * 2.0, X - 1.0)


# ------------------------------------------------------------ scatter, static indices

O = RNG.standard_normal((4, 3)).astype(np.float32)


def test_scatters_with_static_indices_are_window_updates():
    def f(o, u, v):
        return (o.at[2].set(u), o.at[1:3, 1].add(v), o.at[np.array([0, 3, 0])].max(jnp.stack([u, u, u])),
                o.at[-1].multiply(u), o.at[:, 2].min(jnp.concatenate([v, v])))
    g = _check_like_jax(f, O, X[0, :3], X[1, :2])
    assert any(op.kind == "dynamic_update_slice" for op in g.ops)


def test_gradient_of_a_static_gather_is_a_scatter_add():
    def f(o):
        return jax.grad(lambda a: jnp.sum(jnp.sin(a[np.array([1, 1, 3])])))(o)
    _check_like_jax(f, O)


def test_scatter_with_clip_mode_clamps_the_window():
    def f(o, u):
        return o.at[7].set(u, mode="clip"), o.at[-9].add(u, mode="clip")
    _check_like_jax(f, O, X[0, :3])


def test_scatter_on_data_dependent_indices_is_refused():
    def f(o, i):
        return o.at[i].set(0.0)
    with pytest.raises(UnknownOpError, match="indices are not known before run time"):
        _export(f, (O, np.int32(1)))


def test_scatter_set_with_overlapping_windows_is_refused():
    def f(o, u):
        return o.at[np.array([1, 1])].set(jnp.stack([u, u * 2.0]))
    with pytest.raises(UnknownOpError, match="overlapping windows"):
        _export(f, (O, X[0, :3]))


def test_scan_over_micro_batches_slices_the_batch_itself():
    xb = RNG.standard_normal((8, 4)).astype(np.float32)

    def f(x):
        return lax.scan(lambda c, mb: (c + mb.sum(axis=0), mb * 2.0), jnp.zeros(4), x.reshape(4, 2, 4))
    g = _check_like_jax(f, xb)
    prod = g.producer()
    rows = [op for op in g.ops if op.kind == "slice"]
    assert len(rows) == 4 and all(op.inputs == g.inputs for op in rows)  # rows of x, not of its reshape
    assert all(prod.get(op.inputs[0]) is None for op in rows)
