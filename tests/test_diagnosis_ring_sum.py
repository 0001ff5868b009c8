"""Where a failure is reported when an operand of the first op with no relation is
a ring's running sum: each rank adds the block it holds, passes the blocks on with
ppermute, and after a full turn its sum is complete. The rules give it a complete
view and, as every step does, partial views of the ranges its terms wrapped round
(datalog/ring_ranges.dl); no all-reduce follows, as none is needed. A value with a
complete view is reduced: the first failure is the op that loses the relation, not
"the running sum is a partial sum never reduced" (dlverify/diagnosis.py,
Judge._unreduced_partial)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from conftest import bug_line
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_jax

CP = 4
TO_NEXT = [(r, (r + 1) % CP) for r in range(CP)]
ARG = jax.ShapeDtypeStruct((8, 2), jnp.float32)


def seq(x, k):
    return jnp.exp(jnp.exp(x @ k.T).sum(-1))


def ring_sum(x, k):
    """Row sums of exp(x @ k.T) over every block of k, the blocks passed round the ring."""
    total = jnp.exp(x @ k.T).sum(-1)
    for _ in range(CP - 1):
        k = lax.ppermute(k, "cp", TO_NEXT)
        total = total + jnp.exp(x @ k.T).sum(-1)
    return total


def local_ok(x, k):
    return jnp.exp(ring_sum(x, k))


def local_bug(x, k):
    return jnp.exp(ring_sum(x, k) + 1.0)   # BUG


def _dist(f):
    mesh = dlverify.host_mesh((CP,), ("cp",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("cp"), P("cp")), out_specs=P("cp")))


def test_the_ring_sum_verifies():
    assert verify_jax(seq, _dist(local_ok), ARG, ARG, engine="clingo").verified


def test_the_first_failure_is_the_op_that_loses_the_relation():
    res = verify_jax(seq, _dist(local_bug), ARG, ARG, engine="clingo")
    assert not res.verified
    # the premise: the running sum the add reads is complete and partial at once
    add = next(op for op in res.problem.dist.ops
               if op.kind == "add" and op.loc.line == bug_line(local_bug))
    held = [v for v in res.views if v.dist == add.inputs[0] and v.rank == 0]
    assert any(v.complete for v in held) and any(v.partial is not None for v in held), held
    first = res.failures[0]
    assert (first.op, first.line, first.kind) == ("add", bug_line(local_bug), "no-relation"), \
        [(f.op, f.line, f.kind) for f in res.failures[:3]]
    assert not any(f.kind == "unreduced-partial" for f in res.failures), \
        [(f.op, f.line, f.kind, f.message) for f in res.failures]
    # the literal it adds is named as one the sequential program does not have
    assert "operand 1 on rank 0: a constant array equal to no constant" in first.message
