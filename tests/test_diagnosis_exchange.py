"""Where the first failure points when an all-to-all exchanges the wrong dims, in the
module right after XLA's SPMD partitioner (dlverify/resharding.py, dlverify/diagnosis.py).

The partitioner writes a shard_map all_to_all as an exchange followed by
reshapes and transposes, and the user's own reshape after it is data movement
too, so the resharding region the pass rewrites into an all-gather and a slice
ends at the user's reshape. The all-gather is the exchange: when its members'
blocks are not adjacent (the wrong concat axis), the failure must name the
all_to_all's line, not the reshape's line after it.

The correct twin verifies: the location never changes a verdict."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from conftest import bug_line
from hlo_pairs import verify_texts
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.frontends.jax_compiled import dumped_after_spmd

SP = 2
SEQ, H, HD = 8, 4, 2
f32 = jnp.float32


def heads_seq(x, w):
    return jnp.exp(x).reshape(SEQ, H * HD) @ w


def heads_ok(x, w):
    x = jax.lax.all_to_all(x, "sp", split_axis=1, concat_axis=0, tiled=True)
    y = jnp.exp(x)
    y = jax.lax.all_to_all(y, "sp", split_axis=0, concat_axis=1, tiled=True)
    return y.reshape(SEQ // SP, H * HD) @ w


def heads_bug(x, w):
    x = jax.lax.all_to_all(x, "sp", split_axis=1, concat_axis=0, tiled=True)
    y = jnp.exp(x)
    y = jax.lax.all_to_all(y, "sp", split_axis=0, concat_axis=2, tiled=True)  # BUG: concat_axis 1
    return y.reshape(SEQ // SP, H * HD) @ w


ARGS = (jax.ShapeDtypeStruct((SEQ, H, HD), f32), jax.ShapeDtypeStruct((H * HD, H * HD), f32))


def _verify(tmp_path, local):
    mesh = dlverify.host_mesh((SP,), ("sp",))
    dist = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("sp"), P()), out_specs=P("sp")))
    seq = jax.jit(heads_seq).lower(*ARGS).as_text(dialect="hlo")
    return verify_texts(tmp_path, seq, dumped_after_spmd(dist.lower(*ARGS)))


def test_a_wrong_exchange_axis_is_reported_at_the_all_to_all(tmp_path):
    assert _verify(tmp_path, heads_ok).verified
    res = _verify(tmp_path, heads_bug)
    assert not res.verified
    first = res.failures[0]
    lines = {fr.line for fr in first.frames if fr.file.endswith("test_diagnosis_exchange.py")}
    assert bug_line(heads_bug) in lines, \
        [(f.op, f.line, [fr.line for fr in f.frames], f.message[:160]) for f in res.failures[:3]]
