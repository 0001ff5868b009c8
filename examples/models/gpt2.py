"""GPT-2: learned positions, LayerNorm, causal multi-head attention, GELU MLP,
residuals, input and output embedding tied, logits and the cross-entropy loss.

Sequential version and two hand-parallelised shard_map versions over one mesh
axis 'tp' (Megatron-LM layouts):

- tensor parallel (TP): the fused QKV projection is column-parallel (each rank
  holds whole heads: the QKV columns are ordered [head, {q,k,v}, head_dim] as in
  Megatron, so a column split keeps a head's q, k and v together), the attention
  output projection and the MLP down projection are row-parallel (a psum each,
  biases added after it), the token embedding is vocab-parallel (each rank holds
  a vocab slice, looks its ids up, the psum adds the slices), and the tied LM
  head gives vocab-parallel logits that feed a vocab-parallel cross-entropy
  (pmax of the row max, psum of the exp-sums and of the target log-probs).
- tensor + sequence parallel (TP+SP): the residual stream is sharded along the
  sequence; LayerNorms run on sequence shards, an all_gather along the
  sequence precedes each column-parallel layer and a psum_scatter follows each
  row-parallel one (the embedding's psum becomes a psum_scatter too, and each
  rank adds the position embeddings of its own positions).

Formulation choices (kept identical on both sides so ops pair up):
- embedding lookup as a one-hot matmul: `(ids[..., None] == arange(n) + start)
  @ table`. On a vocab shard, `start` is the shard's first id, so ids outside
  the shard match no column: the one-hot row is zero and the lookup contributes
  nothing; this *is* Megatron's "mask the out-of-range ids, look up, zero the
  masked rows" without the gather (jnp.take) and the two selects.
- the target log-prob as `sum(one_hot(labels) * logp)` (again no gather).
- position embeddings as `one_hot(positions, seq) @ wpe`, like HF's
  `wpe(position_ids)`; under SP a rank's positions are arange(S/tp) offset by
  its shard's start. (Config pos_embed="slice" reads them with a dynamic_slice
  instead: same values, but its gradient, a dynamic_update_slice, has no rule
  yet.)
- q, k, v cut from the fused projection with jnp.split, whose gradient is a
  concatenate. (Config qkv_split="index" indexes qkv[..., j, :] instead: same
  values, but its gradient is a pad, which has no rule yet.)
- the max subtracted for a stable softmax goes through stop_gradient (as in
  jax.nn.log_softmax and as in Megatron, whose max is outside autograd).
- Python loops over layers (no lax.scan).

Training cases differentiate the loss with `jax.value_and_grad` inside the
shard_map (check_vma=True): JAX then inserts the all-reduce of the gradients of
replicated parameters (LayerNorm weights, row-parallel biases, position
embeddings) itself, as the transpose of the implicit `pvary`.

Sizes: SMALL has 8 heads so that every rank holds at least 2 at TP=4 (with
one head per rank the local reshape (B,S,3*Dh)->(B,S,1,3,Dh) does not pair
with the sequential one yet; see tests/test_models.py).
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
    heads: int = 8
    d_ff: int = 64
    layers: int = 2
    eps: float = 1e-5
    qkv_split: str = "split"   # "split": jnp.split (backward: concatenate); "index": qkv[..., j, :]
    pos_embed: str = "onehot"  # "onehot": one_hot(pos) @ wpe; "slice": dynamic_slice of wpe

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


SMALL = Config()

LAYER_PARAMS = ("ln1_g", "ln1_b", "w_qkv", "b_qkv", "w_o", "b_o",
                "ln2_g", "ln2_b", "w_fc", "b_fc", "w_proj", "b_proj")


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    D, F = cfg.d_model, cfg.d_ff
    out = {"wte": (cfg.vocab, D), "wpe": (cfg.seq, D)}
    for i in range(cfg.layers):
        shapes = {"ln1_g": (D,), "ln1_b": (D,), "w_qkv": (D, 3 * D), "b_qkv": (3 * D,),
                  "w_o": (D, D), "b_o": (D,), "ln2_g": (D,), "ln2_b": (D,),
                  "w_fc": (D, F), "b_fc": (F,), "w_proj": (F, D), "b_proj": (D,)}
        out.update({f"h{i}.{n}": shapes[n] for n in LAYER_PARAMS})
    out.update({"lnf_g": (D,), "lnf_b": (D,)})
    return out


_LAYER_SPECS = {"ln1_g": P(), "ln1_b": P(), "w_qkv": P(None, "tp"), "b_qkv": P("tp"),
                "w_o": P("tp", None), "b_o": P(), "ln2_g": P(), "ln2_b": P(),
                "w_fc": P(None, "tp"), "b_fc": P("tp"), "w_proj": P("tp", None), "b_proj": P()}


def param_specs(cfg: Config) -> dict[str, P]:
    """The same for TP and TP+SP: only activations change layout under SP."""
    out = {"wte": P("tp", None), "wpe": P()}
    for i in range(cfg.layers):
        out.update({f"h{i}.{n}": _LAYER_SPECS[n] for n in LAYER_PARAMS})
    out.update({"lnf_g": P(), "lnf_b": P()})
    return out


def args(cfg: Config = SMALL) -> tuple[jax.ShapeDtypeStruct, ...]:
    """Parameters (float32) in param_shapes order, then token ids and labels (int32)."""
    params = tuple(jax.ShapeDtypeStruct(s, jnp.float32) for s in param_shapes(cfg).values())
    tokens = jax.ShapeDtypeStruct((cfg.batch, cfg.seq), jnp.int32)
    return params + (tokens, tokens)


def _unpack(cfg: Config, flat):
    names = list(param_shapes(cfg))
    return dict(zip(names, flat[:len(names)])), flat[len(names)], flat[len(names) + 1]


# ------------------------------------------------------------------- layers

def one_hot(ids, n, start=None):
    """(ids[..., None] == start + arange(n)) as float32: ids outside [start, start+n) give a zero row."""
    cols = jnp.arange(n, dtype=ids.dtype)
    if start is not None:
        cols = cols + start
    return (ids[..., None] == cols).astype(jnp.float32)


def positions(cfg: Config, wpe, pos, start=0):
    """Position embeddings of the positions `pos` (the rows of wpe): a one-hot
    matmul, like the token embedding. cfg.pos_embed="slice" reads them with a
    dynamic_slice from `start` instead (same values)."""
    if cfg.pos_embed == "slice":
        return jax.lax.dynamic_slice_in_dim(wpe, start, pos.shape[0], axis=0)
    return one_hot(pos, cfg.seq) @ wpe


def layer_norm(x, g, b, eps):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    xc = x - mu
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    return xc * jax.lax.rsqrt(var + eps) * g + b


def attention(cfg: Config, h, w_qkv, b_qkv, heads: int):
    """Causal self-attention of `heads` heads over the full sequence of h (B, S, D);
    returns the heads' outputs (B, S, heads * head_dim), before the output projection."""
    B, S, _ = h.shape
    Dh = cfg.head_dim
    qkv = (h @ w_qkv + b_qkv).reshape(B, S, heads, 3, Dh)   # Megatron order [head, qkv, dim]
    if cfg.qkv_split == "split":
        q, k, v = (t[:, :, :, 0] for t in jnp.split(qkv, 3, axis=3))
    else:  # "index": the same values; its gradient is a pad per piece (see the module doc)
        q, k, v = qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(Dh)
    causal = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    scores = jnp.where(causal, scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, S, heads * Dh)


def xent(logits, labels, vocab: int):
    """Mean token cross-entropy, log-softmax written out (max, exp-sum, log)."""
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1))
    z = logits - m[..., None]
    sumexp = jnp.sum(jnp.exp(z), axis=-1)
    logp = z - jnp.log(sumexp)[..., None]
    tgt = jnp.sum(one_hot(labels, vocab) * logp, axis=-1)
    return -jnp.mean(tgt)


def xent_vocab_parallel(logits, labels, start, vocab_local: int):
    """Megatron's vocab-parallel cross-entropy on logits (B, S, vocab_local) holding
    vocab ids [start, start + vocab_local): max and sums all-reduced over 'tp'."""
    m = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=-1)), "tp")
    z = logits - m[..., None]
    sumexp = jax.lax.psum(jnp.sum(jnp.exp(z), axis=-1), "tp")
    logp = z - jnp.log(sumexp)[..., None]
    tgt = jax.lax.psum(jnp.sum(one_hot(labels, vocab_local, start) * logp, axis=-1), "tp")
    return -jnp.mean(tgt)


# --------------------------------------------------------------- sequential

def forward_seq(cfg: Config, p, ids):
    x = one_hot(ids, cfg.vocab) @ p["wte"] + positions(cfg, p["wpe"], jnp.arange(cfg.seq))
    for i in range(cfg.layers):
        q = lambda n: p[f"h{i}.{n}"]  # noqa: E731
        h = layer_norm(x, q("ln1_g"), q("ln1_b"), cfg.eps)
        o = attention(cfg, h, q("w_qkv"), q("b_qkv"), cfg.heads)
        x = x + (o @ q("w_o") + q("b_o"))
        h = layer_norm(x, q("ln2_g"), q("ln2_b"), cfg.eps)
        x = x + (jax.nn.gelu(h @ q("w_fc") + q("b_fc")) @ q("w_proj") + q("b_proj"))
    h = layer_norm(x, p["lnf_g"], p["lnf_b"], cfg.eps)
    return jnp.einsum("bsd,vd->bsv", h, p["wte"])          # tied output embedding


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

def forward_local(cfg: Config, tp: int, sp: bool, p, ids):
    """One rank's forward: vocab-parallel logits (B, S, vocab/tp) over the full sequence."""
    Vl, Hl, Sl = cfg.vocab // tp, cfg.heads // tp, cfg.seq // tp
    r = jax.lax.axis_index("tp")
    emb = one_hot(ids, Vl, r * Vl) @ p["wte"]               # this vocab slice's share
    if sp:  # this rank's positions: the local rows offset by the shard's start
        x = jax.lax.psum_scatter(emb, "tp", scatter_dimension=1, tiled=True)
        x = x + positions(cfg, p["wpe"], jnp.arange(Sl) + r * Sl, r * Sl)
    else:
        x = jax.lax.psum(emb, "tp") + positions(cfg, p["wpe"], jnp.arange(cfg.seq))

    def gather(h):          # before a column-parallel layer
        return jax.lax.all_gather(h, "tp", axis=1, tiled=True) if sp else h

    def reduce(y):          # after a row-parallel layer
        return jax.lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True) if sp \
            else jax.lax.psum(y, "tp")

    for i in range(cfg.layers):
        q = lambda n: p[f"h{i}.{n}"]  # noqa: E731
        h = gather(layer_norm(x, q("ln1_g"), q("ln1_b"), cfg.eps))
        o = attention(cfg, h, q("w_qkv"), q("b_qkv"), Hl)
        x = x + (reduce(o @ q("w_o")) + q("b_o"))
        h = gather(layer_norm(x, q("ln2_g"), q("ln2_b"), cfg.eps))
        x = x + (reduce(jax.nn.gelu(h @ q("w_fc") + q("b_fc")) @ q("w_proj")) + q("b_proj"))
    h = gather(layer_norm(x, p["lnf_g"], p["lnf_b"], cfg.eps))
    return jnp.einsum("bsd,vd->bsv", h, p["wte"])


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
    specs = tuple(param_specs(cfg).values())
    in_specs = specs + (P(), P())                     # token ids and labels replicated
    out_specs = (P(), *specs) if train else (P(None, None, "tp"), P())
    return jax.jit(jax.shard_map(local or make_local(cfg, tp, sp, train), mesh=_mesh(tp),
                                 in_specs=in_specs, out_specs=out_specs))


def make_case(tp: int, sp: bool, train: bool, cfg: Config = SMALL) -> dlverify.Case:
    what = "loss and gradients of all parameters" if train else "logits and loss"
    return dlverify.Case(
        seq=make_seq(cfg, train), dist=make_dist(cfg, tp, sp, train), args=args(cfg),
        expect="verified", options={"token_range": cfg.vocab},   # ids/labels in [0, vocab)
        description=f"GPT-2 {cfg.layers} layers, {'TP+SP' if sp else 'TP'}={tp}: {what}")


# -------------------------------------------------------------------- cases

@dlverify.case
def gpt2_tp2_forward():
    return make_case(2, sp=False, train=False)


@dlverify.case
def gpt2_tp4_forward():
    return make_case(4, sp=False, train=False)


@dlverify.case
def gpt2_tp2_sp_forward():
    return make_case(2, sp=True, train=False)


@dlverify.case
def gpt2_tp4_sp_forward():
    return make_case(4, sp=True, train=False)


@dlverify.case
def gpt2_tp2_train():
    return make_case(2, sp=False, train=True)


@dlverify.case
def gpt2_tp4_train():
    return make_case(4, sp=False, train=True)


@dlverify.case
def gpt2_tp2_sp_train():
    return make_case(2, sp=True, train=True)


@dlverify.case
def gpt2_tp4_sp_train():
    return make_case(4, sp=True, train=True)
