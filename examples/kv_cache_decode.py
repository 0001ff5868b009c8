"""One decoding step of attention with a KV cache, heads sharded over 'tp'.

The new token's key and value are written into the caches at the decoding
position `pos`, an input known only at run time (dynamic_update_slice), and the
query attends to the cache positions up to `pos`. Each rank holds its heads'
columns of the projections and its heads of the caches; the output projection's
partial sums are psum'ed. The caches come back sharded by heads.

dlverify pairs the cache writes because both programs write at the same run-time
start (datalog/update_pairs.dl).

Buggy twins: the new entry written one position late, and a mask that hides the
token being decoded.
"""
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

B, S, D, H = 2, 16, 16, 4
DH = D // H


def _args():
    f32 = jnp.float32
    w = jax.ShapeDtypeStruct((D, D), f32)
    cache = jax.ShapeDtypeStruct((B, S, H, DH), f32)
    return (jax.ShapeDtypeStruct((B, D), f32), w, w, w, w, cache, cache,
            jax.ShapeDtypeStruct((), jnp.int32))


# x, wq, wk, wv (heads' columns), wo (heads' rows), k cache, v cache (heads), pos
SPECS = (P(), P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp"), P(None, None, "tp"),
         P(None, None, "tp"), P())
OUT_SPECS = (P(), P(None, None, "tp"), P(None, None, "tp"))


def _dist(local_fn, tp):
    mesh = dlverify.host_mesh((tp,), ("tp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))


def _attend(x, wq, wo, kc, vc, visible):
    q = (x @ wq).reshape(B, -1, DH)
    s = jnp.einsum("bhe,bkhe->bhk", q, kc) / math.sqrt(DH)
    s = jnp.where(visible[None, None, :], s, -1e9)
    o = jnp.einsum("bhk,bkhe->bhe", jax.nn.softmax(s, -1), vc)
    return o.reshape(B, -1) @ wo


def _new_kv(x, wk, wv):
    return (x @ wk).reshape(B, 1, -1, DH), (x @ wv).reshape(B, 1, -1, DH)


# ---------------------------------------------------------------- reference

def decode_seq(x, wq, wk, wv, wo, kc, vc, pos):
    k, v = _new_kv(x, wk, wv)
    kc = jax.lax.dynamic_update_slice(kc, k, (0, pos, 0, 0))
    vc = jax.lax.dynamic_update_slice(vc, v, (0, pos, 0, 0))
    return _attend(x, wq, wo, kc, vc, jnp.arange(S) <= pos), kc, vc


def decode_local(x, wq, wk, wv, wo, kc, vc, pos):
    k, v = _new_kv(x, wk, wv)                           # this rank's heads
    kc = jax.lax.dynamic_update_slice(kc, k, (0, pos, 0, 0))
    vc = jax.lax.dynamic_update_slice(vc, v, (0, pos, 0, 0))
    y = _attend(x, wq, wo, kc, vc, jnp.arange(S) <= pos)   # a partial sum over the heads
    return jax.lax.psum(y, "tp"), kc, vc


@dlverify.case
def kv_cache_decode_tp2():
    return dlverify.Case(
        seq=decode_seq, dist=_dist(decode_local, 2), args=_args(), expect="verified",
        description="KV-cache decoding step, heads sharded, cache written at a run-time position; TP=2")


@dlverify.case
def kv_cache_decode_tp4():
    return dlverify.Case(
        seq=decode_seq, dist=_dist(decode_local, 4), args=_args(), expect="verified",
        description="KV-cache decoding step, heads sharded, cache written at a run-time position; TP=4")


# --------------------------------------------------------------- buggy twins

def decode_local_late_write(x, wq, wk, wv, wo, kc, vc, pos):
    k, v = _new_kv(x, wk, wv)
    kc = jax.lax.dynamic_update_slice(kc, k, (0, pos + 1, 0, 0))  # BUG: written one position late
    vc = jax.lax.dynamic_update_slice(vc, v, (0, pos, 0, 0))
    y = _attend(x, wq, wo, kc, vc, jnp.arange(S) <= pos)
    return jax.lax.psum(y, "tp"), kc, vc


def decode_local_hides_token(x, wq, wk, wv, wo, kc, vc, pos):
    k, v = _new_kv(x, wk, wv)
    kc = jax.lax.dynamic_update_slice(kc, k, (0, pos, 0, 0))
    vc = jax.lax.dynamic_update_slice(vc, v, (0, pos, 0, 0))
    y = _attend(x, wq, wo, kc, vc, jnp.arange(S) < pos)  # BUG: the token being decoded is masked
    return jax.lax.psum(y, "tp"), kc, vc


@dlverify.case
def kv_cache_bug_late_write():
    return dlverify.Case(
        seq=decode_seq, dist=_dist(decode_local_late_write, 2), args=_args(), expect="bug",
        description="KV-cache decoding step writing the new key one position late (TP=2)")


@dlverify.case
def kv_cache_bug_hides_token():
    return dlverify.Case(
        seq=decode_seq, dist=_dist(decode_local_hides_token, 2), args=_args(), expect="bug",
        description="KV-cache decoding step whose mask hides the token being decoded (TP=2)")
