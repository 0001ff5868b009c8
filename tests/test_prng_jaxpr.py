"""JAX's PRNG in jaxprs (frontends/jaxpr/prng.py): typed keys carried as key data,
the generators as whole functions run by JAX (dlverify/ops/random_bits.py), and
layout primitives on key arrays. The IR, run by the shared interpreter, computes
bit for bit what JAX computes; a primitive on key arrays without an exporter is
a one-line error at its line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlverify.errors import UnknownOpError
from dlverify.frontends.jaxpr.walk import Ctx, _dtype, ir_shape, walk
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.ops.random_bits import random_bits, random_fold_in, random_seed, random_split
from dlverify.ops.semantics import Call

KEY = jax.random.key(42)
KEY_DATA = np.asarray(jax.random.key_data(KEY))
X = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
FRY = "threefry2x32"


def _graph(fn, args) -> Graph:
    closed = jax.make_jaxpr(fn)(*args)
    g = Graph("prng")
    b = GraphBuilder(g, IdAllocator())
    g.inputs = [b.tensor(ir_shape(v.aval), _dtype(v.aval)) for v in closed.jaxpr.invars]
    g.outputs = walk(Ctx(b, None, False), closed, g.inputs)
    return g


def _physical(a):
    return np.asarray(jax.random.key_data(a)) if jax.dtypes.issubdtype(
        getattr(a, "dtype", None), jax.dtypes.prng_key) else np.asarray(a)


def _assert_like_jax(fn, args):
    g = _graph(fn, args)
    vals = Interpreter(g, 1).run([[_physical(a)] for a in args])
    want = jax.tree.leaves(jax.jit(fn)(*args))
    assert len(want) == len(g.outputs)
    for t, w in zip(g.outputs, want):
        got, w = np.asarray(vals[t][0]), _physical(w)
        if np.issubdtype(w.dtype, np.floating):   # the interpreter computes over the reals
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6)
        else:                                     # bits and key data: exactly
            np.testing.assert_array_equal(got, w)
    return g


def _split_slice_squeeze(kd, x):
    k1, k2 = jax.random.split(jax.random.wrap_key_data(kd))
    return jax.random.uniform(k1, x.shape) + (jax.random.bits(k2, (3,)) >> 28).sum()


def _bernoulli_dropout(kd, x):
    keep = jax.random.bernoulli(jax.random.fold_in(jax.random.wrap_key_data(kd), 5), 0.75, x.shape)
    return jnp.where(keep, x / 0.75, 0.0)


def _typed_key_argument(key, x):
    a, b = jax.random.split(key, 2)
    return x * jax.random.uniform(a, x.shape) - jax.random.bits(b, (4, 6), jnp.uint8).astype(x.dtype)


def _seeded_inside(x):
    return x + jax.random.uniform(jax.random.key(7), x.shape) + \
        jax.random.uniform(jax.random.PRNGKey(3), x.shape)


def _closed_over_key(x):
    return x + jax.random.uniform(KEY, x.shape)


def _key_array_layout(key, x):
    """Split into a [2,3] array of keys, then transpose, reverse, broadcast, slice,
    pick with select_n and dynamic_slice, each on key arrays, before drawing."""
    keys = jax.random.split(key, (2, 3))
    t = jnp.flip(jnp.transpose(keys), 0)                             # [3, 2]
    wide = jnp.broadcast_to(t[None], (2, 3, 2))
    picked = jnp.where(x[0, 0] > 0, wide[0], wide[1])                # select_n on keys
    row = jax.lax.dynamic_slice_in_dim(picked, 1, 1, axis=0)[0]      # [2]
    folded = jax.random.fold_in(row[1], 9)
    return jax.random.uniform(folded, x.shape), jax.random.key_data(picked)


def _batched_generators(key, x):
    keys = jax.random.split(key, 4)
    bits = jax.vmap(lambda k: jax.random.bits(k, (3,)))(keys)                        # [4, 3]
    folded = jax.vmap(jax.random.fold_in)(keys, jnp.arange(4, dtype=jnp.uint32))
    seeds = jax.vmap(jax.random.key)(jnp.arange(4))
    return bits, jax.random.key_data(folded), jax.random.key_data(seeds)


def _keys_through_control_flow(key, x):
    """A key carried by a scan (split per layer), a cond and a while loop."""
    def layer(carry, i):
        h, k = carry
        k, sub = jax.random.split(k)
        keep = jax.random.bernoulli(jax.random.fold_in(sub, i), 0.8, h.shape)
        return (jnp.where(keep, jnp.tanh(h) / 0.8, 0.0), k), None
    (h, k), _ = jax.lax.scan(layer, (x, key), jnp.arange(3, dtype=jnp.uint32))
    k = jax.lax.cond(x[0, 0] > 0, lambda k: jax.random.fold_in(k, 1), lambda k: k, k)
    _, k = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jax.random.fold_in(c[1], c[0])),
                              (jnp.uint32(0), k))
    return h + jax.random.uniform(k, x.shape)


PROGRAMS = {
    "split_slice_squeeze": (_split_slice_squeeze, (KEY_DATA, X)),
    "bernoulli_dropout": (_bernoulli_dropout, (KEY_DATA, X)),
    "typed_key_argument": (_typed_key_argument, (KEY, X)),
    "seeded_inside": (_seeded_inside, (X,)),
    "closed_over_key": (_closed_over_key, (X,)),
    "key_array_layout": (_key_array_layout, (KEY, X)),
    "key_array_layout_other_branch": (_key_array_layout, (KEY, -X)),
    "batched_generators": (_batched_generators, (KEY, X)),
    "control_flow": (_keys_through_control_flow, (KEY, X)),
    "control_flow_other_branch": (_keys_through_control_flow, (KEY, -X)),
    # the rbg implementations: four-word keys (u32[..., 4]), other generators
    "rbg_typed_key_argument": (_typed_key_argument, (jax.random.key(3, impl="rbg"), X)),
    "unsafe_rbg_key_array_layout": (_key_array_layout, (jax.random.key(3, impl="unsafe_rbg"), X)),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_the_ir_draws_the_bits_jax_draws(name):
    fn, args = PROGRAMS[name]
    g = _assert_like_jax(fn, args)
    assert any(op.kind.startswith("random_") for op in g.ops)


def test_key_data_is_a_u32_tensor_with_the_keys_trailing_dims():
    g = _graph(_key_array_layout, (KEY, X))
    assert g.tensors[g.inputs[0]].shape == (2,) and g.tensors[g.inputs[0]].dtype == "uint32"
    split = next(op for op in g.ops if op.kind == "random_split")
    assert g.tensors[split.output].shape == (2, 3, 2)
    assert split.params == {"impl": FRY, "key_rank": 1, "shape": (2, 3)}


def test_the_evaluators_map_each_key_of_a_batch_alone():
    keys = jax.random.split(KEY, (2, 3))
    data = np.asarray(jax.random.key_data(keys))
    bits = random_bits(Call({"impl": FRY, "key_rank": 1, "bit_width": 16, "shape": (5,)},
                            [data], (2, 3, 5), "uint16"))
    want = jax.vmap(jax.vmap(lambda k: jax.random.bits(k, (5,), jnp.uint16)))(keys)
    np.testing.assert_array_equal(bits, np.asarray(want))
    msgs = np.arange(6, dtype=np.uint32).reshape(2, 3)
    folded = random_fold_in(Call({"impl": FRY, "key_rank": 1}, [data, msgs], (2, 3, 2), "uint32"))
    want = jax.vmap(jax.vmap(jax.random.fold_in))(keys, msgs)
    np.testing.assert_array_equal(folded, np.asarray(jax.random.key_data(want)))
    split = random_split(Call({"impl": FRY, "key_rank": 1, "shape": (2,)}, [data], (2, 3, 2, 2),
                              "uint32"))
    want = jax.vmap(jax.vmap(lambda k: jax.random.split(k)))(keys)
    np.testing.assert_array_equal(split, np.asarray(jax.random.key_data(want)))
    seeded = random_seed(Call({"impl": FRY}, [np.array([1, 2], np.int32)], (2, 2), "uint32"))
    want = [np.asarray(jax.random.key_data(jax.random.key(s))) for s in (1, 2)]
    np.testing.assert_array_equal(seeded, np.stack(want))


def test_a_primitive_on_key_arrays_without_an_exporter_names_its_line():
    def gather_keys(key, idx):
        return jax.random.key_data(jax.random.split(key, 4)[idx])
    with pytest.raises(UnknownOpError, match="'gather' on PRNG key arrays") as e:
        _graph(gather_keys, (KEY, np.array([0, 2], np.int32)))
    assert e.value.file.endswith("test_prng_jaxpr.py") and e.value.line > 0
