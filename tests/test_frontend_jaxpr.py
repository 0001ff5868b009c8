"""The jaxpr frontend: shard_map programs to IR, collectives with their groups,
inlined calls, and relations read from in_specs/out_specs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import dlverify
from dlverify.errors import InputError
from dlverify.frontends.jaxpr import import_jax

F32 = jnp.float32


def _mesh(shape, names):
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def _smap(f, mesh, in_specs, out_specs, check_vma=True):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=check_vma))


def test_multi_axis_psum_and_all_gather_groups():
    mesh = _mesh((2, 2), ("dp", "tp"))
    x = jax.ShapeDtypeStruct((8, 4), F32)

    def loc(v):
        return jax.lax.psum(jnp.sum(v, axis=0, keepdims=True), ("dp", "tp"))

    p = import_jax(lambda v: jnp.sum(v, axis=0, keepdims=True),
                   _smap(loc, mesh, (P(("dp", "tp")),), P()), (x,))
    (ar,) = [op for op in p.dist.ops if op.kind == "all_reduce"]
    assert ar.params == {"reducer": "sum", "groups": [[0, 1, 2, 3]]}
    assert [o[0] for o in p.inputs[0].offsets] == [0, 2, 4, 6]
    res = dlverify.verify_jax(lambda v: jnp.sum(v, axis=0, keepdims=True),
                              _smap(loc, mesh, (P(("dp", "tp")),), P()), x)
    assert res.verified

    gathered = _smap(lambda v: jax.lax.all_gather(v, ("dp", "tp"), axis=0, tiled=True), mesh,
                     (P(("dp", "tp")),), P(), check_vma=False)
    assert dlverify.verify_jax(lambda v: v, gathered, x).verified
    # gathering over the axes in the other order concatenates the blocks out of order
    swapped = _smap(lambda v: jax.lax.all_gather(v, ("tp", "dp"), axis=0, tiled=True), mesh,
                    (P(("dp", "tp")),), P(), check_vma=False)
    assert not dlverify.verify_jax(lambda v: v, swapped, x).verified


def test_axis_index_groups_and_scale_of_a_sum_of_replicas():
    mesh = _mesh((4,), ("x",))
    x = jax.ShapeDtypeStruct((8, 4), F32)
    dist = _smap(lambda v: jax.lax.psum(v, "x", axis_index_groups=[[0, 1], [2, 3]]), mesh,
                 (P(),), P(), check_vma=False)
    p = import_jax(lambda v: 2.0 * v, dist, (x,))
    (ar,) = [op for op in p.dist.ops if op.kind == "all_reduce"]
    assert ar.params["groups"] == [[0, 1], [2, 3]]
    assert dlverify.verify_jax(lambda v: 2.0 * v, dist, x).verified
    res = dlverify.verify_jax(lambda v: v, dist, x)
    assert not res.verified and res.failures[0].kind == "scale-mismatch"
    assert "scale differs by 2" in res.failures[0].message


def test_pmax_pmean_psum_scatter_and_axis_index():
    mesh = _mesh((2,), ("x",))
    x = jax.ShapeDtypeStruct((8, 4), F32)

    def loc(v):
        m = jax.lax.pmax(jnp.max(v, axis=0), "x")
        s = jax.lax.psum_scatter(v, "x", scatter_dimension=1, tiled=True)
        mean = jax.lax.pmean(jnp.sum(v, axis=0), "x")
        return m, s, mean

    def seq(v):
        return jnp.max(v, axis=0), jnp.sum(v.reshape(2, 4, 4), axis=0), jnp.sum(v, axis=0) / 2

    dist = _smap(loc, mesh, (P("x"),), (P(), P(None, "x"), P()), check_vma=False)
    p = import_jax(seq, dist, (x,))
    kinds = [op.kind for op in p.dist.ops]
    assert {"all_reduce", "reduce_scatter"} <= set(kinds)
    assert {op.params["reducer"] for op in p.dist.ops if op.kind == "all_reduce"} == {"max", "sum"}


def test_nested_jit_custom_jvp_and_checkpoint_are_inlined():
    mesh = _mesh((2,), ("x",))
    x = jax.ShapeDtypeStruct((4, 6), F32)

    @jax.jit
    def inner(v):
        return jax.nn.relu(v) * 2.0   # relu is a custom_jvp function

    def seq(v):
        return jax.checkpoint(inner)(v)

    dist = _smap(lambda v: jax.checkpoint(inner)(v), mesh, (P(None, "x"),), P(None, "x"))
    p = import_jax(seq, dist, (x,))
    assert "max" in {op.kind for op in p.seq.ops}
    assert not {"jit", "custom_jvp_call", "checkpoint"} & {op.kind for op in p.dist.ops}
    assert dlverify.verify_jax(seq, dist, x).verified


def test_dist_fn_must_be_a_shard_map():
    x = jax.ShapeDtypeStruct((4,), F32)
    with pytest.raises(InputError, match="shard_map"):
        import_jax(lambda v: v * 2, jax.jit(lambda v: v * 2), (x,))


def test_out_spec_local_shape_mismatch_is_an_input_error():
    mesh = _mesh((2,), ("x",))
    x = jax.ShapeDtypeStruct((4, 6), F32)
    dist = _smap(lambda v: v, mesh, (P(None, "x"),), P(None, "x"))
    with pytest.raises(InputError, match="returns 2 arrays"):
        import_jax(lambda v: (v, v), dist, (x,))


def _routing(x):
    """MoE-style routing on rows held whole: top-2 experts and an argsort."""
    vals, idx = jax.lax.top_k(x, 2)
    order = jnp.argsort(x, axis=1)
    return vals * idx.astype(x.dtype), order.astype(x.dtype) + jnp.sort(x, axis=1)


def test_top_k_and_argsort_are_exported_per_result_and_verify():
    from dlverify.api import verify_jax
    mesh = _mesh((2,), ("dp",))
    x = jax.ShapeDtypeStruct((8, 6), jnp.float32)
    p = import_jax(_routing, _smap(_routing, mesh, (P("dp", None),), (P("dp", None), P("dp", None))), (x,))
    kinds = [(op.kind, op.params.get("output")) for op in p.dist.ops if op.kind in ("top_k", "sort")]
    assert sorted(kinds) == sorted([("top_k", 0), ("top_k", 1), ("sort", 0), ("sort", 1), ("sort", 0)])
    good = verify_jax(_routing, _smap(_routing, mesh, (P("dp", None),), (P("dp", None), P("dp", None))),
                      x, engine="clingo")
    assert good.verified, [(f.op, f.line, f.message) for f in good.failures[:2]]
    # the experts' dim split instead: top_k over a split axis is not the top-2 of the row
    bad = verify_jax(_routing, _smap(_routing, mesh, (P(None, "dp"),), (P(), P(None, "dp")), False),
                     jax.ShapeDtypeStruct((8, 4), jnp.float32), engine="clingo")
    assert not bad.verified and bad.failures[0].op in ("top_k", "sort")


def test_a_descending_sort_a_sort_then_a_rev_verifies_on_rows_held_whole():
    from dlverify.api import verify_jax
    mesh = _mesh((2,), ("dp",))
    x = jax.ShapeDtypeStruct((8, 6), jnp.float32)

    def desc(v):
        return jnp.sort(v, axis=1, descending=True)

    p = import_jax(desc, _smap(desc, mesh, (P("dp", None),), P("dp", None)), (x,))
    assert [op.kind for op in p.dist.ops] == ["sort", "rev"]   # JAX: a sort, then a rev
    res = verify_jax(desc, _smap(desc, mesh, (P("dp", None),), P("dp", None)), x, engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:2]]
