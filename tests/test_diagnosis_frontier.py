"""Where a failure is reported when the distributed program relates a value only
through a chain of ops that move no element: JAX's transpose of a broadcast sums
over every size-1 dim of its operand, so a rank holding one row reduces over that
row's size-1 dim too (a result of another rank than the sequential one, with no
view of its own) and broadcasts the dim back (related again). Neither op is where
a relation stops: the first failure is the buggy op after them (dlverify/diagnosis.py
drops bridged frontier ops; dlverify/correspondence.py never blames an op that only
inserts or removes size-1 dims)."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_jax


def centred_grad(x):
    return jax.grad(lambda x: jnp.sum(jnp.sin(x - jnp.sum(x, axis=1, keepdims=True))))(x)


def seq(x):
    return jnp.cos(centred_grad(x))


def local_ok(x):
    g = centred_grad(x)
    return jnp.cos(g)


def local_bug(x):
    g = centred_grad(x)
    return jnp.cos(g * 2.0)   # BUG


ARG = jax.ShapeDtypeStruct((2, 8), jnp.float32)   # one row per rank


def _dist(f):
    mesh = dlverify.host_mesh((2,), ("dp",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("dp", None),), out_specs=P("dp")))


def _line(fn, marker):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(lines) if marker in s)


def test_the_local_program_reduces_over_its_size_1_row_dim():
    # the premise: the distributed transpose of the broadcast reduces both dims
    jaxpr = jax.make_jaxpr(jax.shard_map(local_ok, mesh=dlverify.host_mesh((2,), ("dp",)),
                                         in_specs=(P("dp", None),), out_specs=P("dp")))(
        jnp.zeros((2, 8)))
    sums = [e for e in jaxpr.eqns[0].params["jaxpr"].eqns if e.primitive.name == "reduce_sum"]
    assert any(tuple(e.params["axes"]) == (0, 1) for e in sums)


def test_the_correct_program_verifies():
    assert verify_jax(seq, _dist(local_ok), ARG, engine="clingo").verified


def test_the_first_failure_is_the_bug_not_the_bridged_chain():
    res = verify_jax(seq, _dist(local_bug), ARG, engine="clingo")
    assert not res.verified
    first = res.failures[0]
    # the product by 2 makes the gradient twice the sequential one: reported there
    # (dlverify/diagnosis_origin.py), where cos finally reads it
    assert (first.op, first.line, first.kind) == ("mul", _line(local_bug, "# BUG"), "scale-mismatch"), \
        [(f.op, f.line, f.kind) for f in res.failures[:3]]
    assert "2 times the sequential one" in first.message and "cos at" in first.message
    # neither the size-1 reduction nor the broadcast reinserting the dim is blamed
    grad_line = _line(centred_grad, "jax.grad")
    assert not any(f.line == grad_line and f.op in ("reduce_sum", "broadcast_in_dim")
                   for f in res.failures), [(f.op, f.line, f.kind) for f in res.failures]
