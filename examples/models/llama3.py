"""Llama-3: RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU
MLP, untied LM head, and the cross-entropy loss.

Sequential version and two hand-parallelised shard_map versions over one mesh
axis 'tp' (Megatron-LM layouts):

- tensor parallel (TP): the fused QKV projection is column-parallel, the
  attention output projection and the MLP down projection are row-parallel
  (a psum each), the fused gate/up projection of the SwiGLU MLP is
  column-parallel, the token embedding is vocab-parallel (one-hot lookup of the
  rank's vocab slice, psum), and the LM head is column-parallel over the vocab
  and feeds a vocab-parallel cross-entropy (pmax of the max, psum of the
  exp-sums and target log-probs).
- tensor + sequence parallel (TP+SP): the residual stream is sharded along the
  sequence, RMSNorms run on sequence shards, all_gather along the sequence
  before each column-parallel layer, psum_scatter after each row-parallel one
  (and after the embedding). Rotary embeddings are applied after the
  all_gather, on the full sequence, so their positions need no offset.

Grouped-query attention: `heads` query heads in `kv_heads` groups of
`heads // kv_heads`; the weights keep the group as a dim (no reshape of heads,
einsums throughout, as in JAX Llama implementations):
  w_qkv (D, G, qpg + 2, Dh): Megatron's fused GQA layout, per group its qpg
         query heads, then its key head, then its value head;
  w_o   (G, qpg, Dh, D).
When kv_heads is a multiple of tp, the groups are split over the ranks (the
fused weight and w_o sharded on G). When there are fewer KV heads than ranks,
each KV head is replicated on tp // kv_heads ranks: rank r serves group
r // rep and the query heads [j0, j0 + qpl) of it; the fused weight and w_o
stay replicated and each rank dynamic_slices its query and key/value columns
(two column-parallel matmuls instead of one).

Formulation choices (identical on both sides, so ops pair up): one-hot
matmuls for the embedding lookup and the target log-prob (no gather; on a
vocab shard out-of-range ids give an all-zero one-hot row, which is Megatron's
mask-lookup-zero), jnp.split to cut fused projections (its gradient is a
concatenate; indexing would give pads), stop_gradient on the softmax max,
Python loops over layers, or (scan_layers=True, as MaxText stacks layers) the
layer weights stacked on a leading dim and the layers a lax.scan.

Rotary tables (cos, sin) and the causal mask are computed once per forward,
before the layers, and broadcast straight from (S, Dh) to the q/k shape.

Training cases differentiate the loss with jax.value_and_grad inside the
shard_map (check_vma=True), so JAX all-reduces the gradients of replicated
parameters (norm weights) itself.

Verifier coverage (tests/test_models.py): SMALL (16 heads, 8 KV groups) has
at least 2 KV groups per rank at TP=4 and verifies forward and backward; so do
one KV group or one KV head per rank (as Llama-3.1-405B at TP=8), KV heads
replicated on 2 or 4 ranks (fewer KV heads than ranks), and the unfused MLP
under SP.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify


class Config(NamedTuple):
    """Model sizes (a NamedTuple: case files are loaded without a sys.modules entry,
    which dataclasses need)."""

    vocab: int = 64
    seq: int = 8
    batch: int = 2
    d_model: int = 32
    heads: int = 16
    kv_heads: int = 8
    head_dim: int = 4
    d_ff: int = 64
    layers: int = 2
    eps: float = 1e-5
    rope_theta: float = 500000.0
    mlp_fused: bool = True   # gate/up as one (D, 2, F) column-parallel matmul (Megatron's fc1)
    scan_layers: bool = False  # layer weights stacked (L, ...) and the layers a lax.scan (MaxText)
    dtype: str = "float32"

    @property
    def q_per_group(self) -> int:
        return self.heads // self.kv_heads


SMALL = Config()
# Llama-3.1-405B dimensions (bench/bench_llama405b.py). The real model is bfloat16:
# float32 is the default here, and `dtype="bfloat16"` (bench --dtype bfloat16)
# verifies too, f32 <-> bf16 casts being precision casts (tests/test_models.py).
LLAMA31_405B = Config(vocab=128256, seq=4096, batch=1, d_model=16384, heads=128, kv_heads=8,
                      head_dim=128, d_ff=53248, layers=126, eps=1e-5, rope_theta=500000.0)


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    D, F, G, Dh, qpg = cfg.d_model, cfg.d_ff, cfg.kv_heads, cfg.head_dim, cfg.q_per_group
    mlp = {"w_gate_up": (D, 2, F)} if cfg.mlp_fused else {"w_gate": (D, F), "w_up": (D, F)}
    layer = {"attn_norm": (D,), "w_qkv": (D, G, qpg + 2, Dh), "w_o": (G, qpg, Dh, D),
             "mlp_norm": (D,), **mlp, "w_down": (F, D)}
    out = {"embed": (cfg.vocab, D)}
    if cfg.scan_layers:
        out.update({f"layers.{n}": (cfg.layers,) + shape for n, shape in layer.items()})
    else:
        for i in range(cfg.layers):
            out.update({f"l{i}.{n}": shape for n, shape in layer.items()})
    out.update({"final_norm": (D,), "lm_head": (D, cfg.vocab)})
    return out


def kv_sharded(cfg: Config, tp: int) -> bool:
    """KV heads split over the ranks (else replicated: fewer KV heads than ranks)."""
    return cfg.kv_heads % tp == 0


def param_specs(cfg: Config, tp: int) -> dict[str, P]:
    """The same for TP and TP+SP."""
    attn = P(None, "tp", None, None) if kv_sharded(cfg, tp) else P()
    w_o = P("tp", None, None, None) if kv_sharded(cfg, tp) else P()
    specs = {"attn_norm": P(), "w_qkv": attn, "w_o": w_o, "mlp_norm": P(),
             "w_gate_up": P(None, None, "tp"), "w_gate": P(None, "tp"), "w_up": P(None, "tp"),
             "w_down": P("tp", None)}
    out = {}
    for name in param_shapes(cfg):
        if "." in name:
            spec = specs[name.split(".", 1)[1]]
            out[name] = P(None, *spec) if cfg.scan_layers else spec
    out = {"embed": P("tp", None), **out, "final_norm": P(), "lm_head": P(None, "tp")}
    return {n: out[n] for n in param_shapes(cfg)}


def args(cfg: Config = SMALL) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Parameters in param_shapes order, then token ids and labels (int32)."""
    dt = jnp.dtype(cfg.dtype)
    params = tuple(jax.ShapeDtypeStruct(s, dt) for s in param_shapes(cfg).values())
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
    return params + (tokens, tokens)


def _unpack(cfg: Config, flat):
    names = list(param_shapes(cfg))
    return dict(zip(names, flat[:len(names)])), flat[len(names)], flat[len(names) + 1]


# ------------------------------------------------------------------- layers

def one_hot(ids, n, start=None, dtype=jnp.float32):
    """(ids[..., None] == start + arange(n)): ids outside [start, start+n) give a zero row."""
    cols = jnp.arange(n, dtype=ids.dtype)
    if start is not None:
        cols = cols + start
    return (ids[..., None] == cols).astype(dtype)


def rms_norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_tables(cfg: Config, seq: int, dtype):
    """cos and sin (seq, head_dim) of the rotate-half rotary embedding at positions 0..seq-1,
    computed once per forward (like Llama's precomputed freqs_cis)."""
    half = cfg.head_dim // 2
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv_freq[None, :]    # (S, half)
    cos = jnp.concatenate([jnp.cos(angles), jnp.cos(angles)], axis=-1).astype(dtype)
    sin = jnp.concatenate([jnp.sin(angles), jnp.sin(angles)], axis=-1).astype(dtype)
    return cos, sin


def rope(x, cos, sin, seq_axis: int = 1):
    """Rotate-half rotary embedding of x (B, S, ..., Dh)."""
    # Broadcast (S, Dh) straight to x's shape: with an implicit broadcast of a
    # (1, S, 1, 1, Dh) table, a rank holding a single KV group (size-1 dim 2)
    # keeps dim 2 where the sequential side expands it, and the broadcasts no
    # longer pair up (see the module doc of tests/test_models.py).
    dims = (seq_axis, x.ndim - 1)
    cos = jax.lax.broadcast_in_dim(cos, x.shape, dims)
    sin = jax.lax.broadcast_in_dim(sin, x.shape, dims)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def attention_core(cfg: Config, q, k, v, tables):
    """Causal GQA over the full sequence: q (B,S,g,j,Dh), k and v (B,S,g,Dh) -> o (B,S,g,j,Dh)."""
    cos, sin, causal = tables
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    scores = jnp.einsum("bqgjd,bkgd->bgjqk", q, k) / math.sqrt(cfg.head_dim)
    scores = jnp.where(causal, scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bgjqk,bkgd->bqgjd", probs, v)


def tables(cfg: Config, dtype):
    """Per-forward constants: rotary cos and sin, and the causal mask (query >= key)."""
    S = cfg.seq
    cos, sin = rope_tables(cfg, S, dtype)
    return cos, sin, jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]


def qkv_fused(cfg: Config, h, w_qkv, q_heads: int):
    """The fused QKV projection and its split into q, k, v along the head-slot dim."""
    qkv = jnp.einsum("bsd,dgjk->bsgjk", h, w_qkv)
    q, k, v = jnp.split(qkv, [q_heads, q_heads + 1], axis=3)
    return q, k[:, :, :, 0], v[:, :, :, 0]


def swiglu(cfg: Config, h, lp):
    if cfg.mlp_fused:
        gu = jnp.einsum("bsd,dkf->bskf", h, lp["w_gate_up"])
        gate, up = (t[:, :, 0] for t in jnp.split(gu, 2, axis=2))
    else:
        gate, up = h @ lp["w_gate"], h @ lp["w_up"]
    return jax.nn.silu(gate) * up


def run_layers(cfg: Config, p, x, block):
    """x after every layer: block(x, lp) with lp one layer's weights by short name;
    a Python loop over l{i}.* weights, or a lax.scan over the stacked layers.*."""
    if cfg.scan_layers:
        stacked = {n.split(".", 1)[1]: w for n, w in p.items() if n.startswith("layers.")}
        return jax.lax.scan(lambda h, lp: (block(h, lp), None), x, stacked)[0]
    for i in range(cfg.layers):
        x = block(x, {n.split(".", 1)[1]: w for n, w in p.items() if n.startswith(f"l{i}.")})
    return x


def xent(logits, labels, vocab: int):
    """Mean token cross-entropy, log-softmax written out (max, exp-sum, log)."""
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
    z = logits - m[..., None]
    sumexp = jnp.sum(jnp.exp(z), axis=-1)
    logp = z - jnp.log(sumexp)[..., None]
    tgt = jnp.sum(one_hot(labels, vocab, dtype=logp.dtype) * logp, axis=-1)
    return -jnp.mean(tgt)


def xent_vocab_parallel(logits, labels, start, vocab_local: int):
    """Megatron's vocab-parallel cross-entropy on the vocab slice [start, start + vocab_local)."""
    m = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=-1)), "tp")
    z = logits - m[..., None]
    sumexp = jax.lax.psum(jnp.sum(jnp.exp(z), axis=-1), "tp")
    logp = z - jnp.log(sumexp)[..., None]
    tgt = jnp.sum(one_hot(labels, vocab_local, start, dtype=logp.dtype) * logp, axis=-1)
    return -jnp.mean(jax.lax.psum(tgt, "tp"))


# --------------------------------------------------------------- sequential

def forward_seq(cfg: Config, p, ids):
    dt = jnp.dtype(cfg.dtype)
    tabs = tables(cfg, dt)
    x = one_hot(ids, cfg.vocab, dtype=dt) @ p["embed"]

    def block(x, lp):
        h = rms_norm(x, lp["attn_norm"], cfg.eps)
        q, k, v = qkv_fused(cfg, h, lp["w_qkv"], cfg.q_per_group)
        o = attention_core(cfg, q, k, v, tabs)
        x = x + jnp.einsum("bsgjd,gjde->bse", o, lp["w_o"])
        h = rms_norm(x, lp["mlp_norm"], cfg.eps)
        return x + swiglu(cfg, h, lp) @ lp["w_down"]
    x = run_layers(cfg, p, x, block)
    h = rms_norm(x, p["final_norm"], cfg.eps)
    return h @ p["lm_head"]


def make_seq(cfg: Config, train: bool):
    n = len(param_shapes(cfg))

    def loss_fn(*flat):
        p, ids, labels = _unpack(cfg, flat)
        return xent(forward_seq(cfg, p, ids), labels, cfg.vocab)

    def fwd(*flat):
        p, ids, labels = _unpack(cfg, flat)
        logits = forward_seq(cfg, p, ids)
        return logits, xent(logits, labels, cfg.vocab)

    def train_step(*flat):
        loss, grads = jax.value_and_grad(loss_fn, argnums=tuple(range(n)))(*flat)
        return (loss, *grads)

    return train_step if train else fwd


# -------------------------------------------------------------- distributed

def attention_local(cfg: Config, tp: int, h, w_qkv, w_o, tabs):
    """One rank's heads: partial sums (over the rank's heads) of the attention output."""
    qpg = cfg.q_per_group
    if kv_sharded(cfg, tp):          # this rank's groups, whole: one fused matmul
        q, k, v = qkv_fused(cfg, h, w_qkv, qpg)
    else:                            # KV head replicated on `rep` ranks
        rep = tp // cfg.kv_heads
        qpl = qpg // rep
        r = jax.lax.axis_index("tp")
        g, j0 = r // rep, (r % rep) * qpl
        D, Dh = cfg.d_model, cfg.head_dim
        wq = jax.lax.dynamic_slice(w_qkv, (0, g, j0, 0), (D, 1, qpl, Dh))
        wkv = jax.lax.dynamic_slice(w_qkv, (0, g, qpg, 0), (D, 1, 2, Dh))
        q = jnp.einsum("bsd,dgjk->bsgjk", h, wq)
        k, v = (t[:, :, :, 0] for t in jnp.split(jnp.einsum("bsd,dgjk->bsgjk", h, wkv), 2, axis=3))
        w_o = jax.lax.dynamic_slice(w_o, (g, j0, 0, 0), (1, qpl, Dh, D))
    o = attention_core(cfg, q, k, v, tabs)
    return jnp.einsum("bsgjd,gjde->bse", o, w_o)


def forward_local(cfg: Config, tp: int, sp: bool, p, ids):
    """One rank's forward: vocab-parallel logits (B, S, vocab/tp) over the full sequence."""
    dt = jnp.dtype(cfg.dtype)
    Vl = cfg.vocab // tp
    tabs = tables(cfg, dt)       # attention runs on the full sequence: positions 0..S-1
    r = jax.lax.axis_index("tp")
    emb = one_hot(ids, Vl, r * Vl, dtype=dt) @ p["embed"]        # this vocab slice's share

    def gather(h):          # before a column-parallel layer
        return jax.lax.all_gather(h, "tp", axis=1, tiled=True) if sp else h

    def reduce(y):          # after a row-parallel layer (and the embedding)
        return jax.lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True) if sp \
            else jax.lax.psum(y, "tp")

    def block(x, lp):
        h = gather(rms_norm(x, lp["attn_norm"], cfg.eps))
        x = x + reduce(attention_local(cfg, tp, h, lp["w_qkv"], lp["w_o"], tabs))
        h = gather(rms_norm(x, lp["mlp_norm"], cfg.eps))
        return x + reduce(swiglu(cfg, h, lp) @ lp["w_down"])
    x = run_layers(cfg, p, reduce(emb), block)
    h = gather(rms_norm(x, p["final_norm"], cfg.eps))
    return h @ p["lm_head"]


def make_local(cfg: Config, tp: int, sp: bool, train: bool):
    n = len(param_shapes(cfg))
    Vl = cfg.vocab // tp

    def fwd(*flat):
        p, ids, labels = _unpack(cfg, flat)
        logits = forward_local(cfg, tp, sp, p, ids)
        return logits, xent_vocab_parallel(logits, labels, jax.lax.axis_index("tp") * Vl, Vl)

    def loss_local(*flat):
        return fwd(*flat)[1]

    def train_step(*flat):
        loss, grads = jax.value_and_grad(loss_local, argnums=tuple(range(n)))(*flat)
        return (loss, *grads)

    return train_step if train else fwd


def _mesh(tp: int):
    return dlverify.host_mesh((tp,), ("tp",))


def make_dist(cfg: Config, tp: int, sp: bool, train: bool, local=None):
    specs = tuple(param_specs(cfg, tp).values())
    in_specs = specs + (P(), P())                     # token ids and labels replicated
    out_specs = (P(), *specs) if train else (P(None, None, "tp"), P())
    return jax.jit(jax.shard_map(local or make_local(cfg, tp, sp, train), mesh=_mesh(tp),
                                 in_specs=in_specs, out_specs=out_specs))


def make_case(tp: int, sp: bool, train: bool, cfg: Config = SMALL) -> dlverify.Case:
    what = "loss and gradients of all parameters" if train else "logits and loss"
    kv = "KV heads sharded" if kv_sharded(cfg, tp) else "KV heads replicated"
    return dlverify.Case(
        seq=make_seq(cfg, train), dist=make_dist(cfg, tp, sp, train), args=args(cfg),
        expect="verified", options={"token_range": cfg.vocab},   # ids/labels in [0, vocab)
        description=f"Llama-3 {cfg.layers} layers{' (lax.scan)' if cfg.scan_layers else ''}, "
                    f"{'TP+SP' if sp else 'TP'}={tp}, {kv}: {what}")


# -------------------------------------------------------------------- cases
# SMALL has 16 query heads in 8 KV groups: 4 or 2 groups per rank at TP=2 and 4.

@dlverify.case
def llama3_tp2_forward():
    return make_case(2, sp=False, train=False)


@dlverify.case
def llama3_tp4_forward():
    return make_case(4, sp=False, train=False)


@dlverify.case
def llama3_tp2_sp_forward():
    return make_case(2, sp=True, train=False)


@dlverify.case
def llama3_tp4_sp_forward():
    return make_case(4, sp=True, train=False)


@dlverify.case
def llama3_tp2_train():
    return make_case(2, sp=False, train=True)


@dlverify.case
def llama3_tp4_train():
    return make_case(4, sp=False, train=True)


@dlverify.case
def llama3_tp2_sp_train():
    return make_case(2, sp=True, train=True)


@dlverify.case
def llama3_tp4_sp_train():
    return make_case(4, sp=True, train=True)


# Layers as a lax.scan over stacked weights (3 layers): dlverify unrolls the scan.
SCANNED = SMALL._replace(scan_layers=True, layers=3)


@dlverify.case
def llama3_scan_tp2_sp_forward():
    return make_case(2, sp=True, train=False, cfg=SCANNED)


@dlverify.case
def llama3_scan_tp2_train():
    return make_case(2, sp=False, train=True, cfg=SCANNED)
