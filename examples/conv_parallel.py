"""Convolutions split over ranks: channel (tensor) parallelism, data parallelism,
and spatial parallelism with halo exchange, as in CNNs, ViT patch embeddings and
the causal depthwise conv of Mamba/Hyena-style sequence models.

- Channel parallel (TP=2): conv1's output channels are split over 'tp' (its kernel
  split on O), conv2 reads its own input channels (its kernel split on I) and
  the partial sums are psum'd. Forward (also with a max pool between the convs)
  and weight gradients.
- Causal depthwise conv1d over a sequence split over 'sp' (SP=4): rank r needs
  the last K-1 positions of rank r-1 (a halo), received with ppermute; rank 0
  receives nothing (zeros), which is the causal zero padding.
- 2-D halo exchange (SP=4 over image rows): a 3x3 SAME conv on a row block reads
  one row above and one below from the neighbours; the image border's zero rows
  are the ppermute's zeros on the first and last rank.
- ViT patch embedding with the embedding dim split over 'tp'.
- Data parallel (DP=4) with synchronised batch norm: each rank's per-channel sums
  of its batch are psum'd before the mean and variance are taken (forward); a
  conv's kernel gradient, pmean'd.

Twins: the halo from the wrong neighbour; each shard zero-padded on its own (the
causal conv restarts on every shard); channel-parallel conv2 without its psum, or
with its run-time weight scale (equalised learning rate) from the local shard's
fan-in; the 2-D halo rows swapped; batch norm with each rank's own statistics.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify

TP, SP = 2, 4
B, C, H, W = 2, 4, 8, 8          # images (NCHW)
C1, C2 = 8, 6                    # conv1 / conv2 output channels
L, D, K = 32, 4, 4               # sequence length, channels, causal kernel size
LOCAL = L // SP
IMG_ROWS = H // SP


def _conv(x, w, padding="SAME", stride=(1, 1)):
    return lax.conv_general_dilated(x, w, stride, padding)


# -- channel parallel ---------------------------------------------------------

def _cnn_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B, C, H, W), f32), jax.ShapeDtypeStruct((C1, C, 3, 3), f32),
            jax.ShapeDtypeStruct((C2, C1, 3, 3), f32))


# Equalised learning rate (ProGAN, StyleGAN): weights scaled at run time by He's
# constant of the layer's fan-in; the global fan-in on every rank.
HE1, HE2 = float(np.sqrt(2.0 / (C * 9))), float(np.sqrt(2.0 / (C1 * 9)))


def cnn_seq(x, w1, w2):
    return _conv(jax.nn.relu(_conv(x, w1 * HE1)), w2 * HE2)


def cnn_local(x, w1, w2):
    h = jax.nn.relu(_conv(x, w1 * HE1))           # this rank's C1 / TP channels
    return lax.psum(_conv(h, w2 * HE2), "tp")     # partial sums over the input channels


def cnn_local_missing_psum(x, w1, w2):
    h = jax.nn.relu(_conv(x, w1 * HE1))
    return _conv(h, w2 * HE2)  # BUG: conv2 sums only this rank's input channels, no psum


def cnn_local_local_fan_in(x, w1, w2):
    h = jax.nn.relu(_conv(x, w1 * HE1))
    w2s = w2 * float(np.sqrt(2.0 / (w2.shape[1] * 9)))  # BUG: the fan-in of this rank's shard
    return lax.psum(_conv(h, w2s), "tp")


def _cnn_dist(fn, out_specs=P(), check_vma=True):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P(), P("tp"), P(None, "tp")),
                                 out_specs=out_specs, check_vma=check_vma))


@dlverify.case
def conv_channel_parallel():
    return dlverify.Case(seq=cnn_seq, dist=_cnn_dist(cnn_local), args=_cnn_args(),
                         expect="verified",
                         description="conv1 split on output channels, conv2 on input channels, psum; TP=2")


@dlverify.case
def conv_channel_parallel_bug_missing_psum():
    return dlverify.Case(seq=cnn_seq, dist=_cnn_dist(cnn_local_missing_psum, check_vma=False),
                         args=_cnn_args(), expect="bug",
                         description="channel-parallel conv2 without the psum of its partial sums")


@dlverify.case
def conv_channel_parallel_bug_local_fan_in():
    return dlverify.Case(seq=cnn_seq, dist=_cnn_dist(cnn_local_local_fan_in), args=_cnn_args(),
                         expect="bug",
                         description="the run-time weight scale computed from the local shard's fan-in")


def _max_pool(h):
    """3x3 windows, stride 2, SAME (-inf padding): ResNet's stem pooling."""
    return lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 3, 3), (1, 1, 2, 2), "SAME")


def pool_seq(x, w1, w2):
    return _conv(_max_pool(jax.nn.relu(_conv(x, w1 * HE1))), w2 * HE2)


def pool_local(x, w1, w2):
    h = _max_pool(jax.nn.relu(_conv(x, w1 * HE1)))   # pooled per channel: this rank's
    return lax.psum(_conv(h, w2 * HE2), "tp")


@dlverify.case
def conv_pool_channel_parallel():
    return dlverify.Case(seq=pool_seq, dist=_cnn_dist(pool_local), args=_cnn_args(),
                         expect="verified",
                         description="channel-parallel convs with a max pool between them; TP=2")


def cnn_grads_seq(x, w1, w2):
    return jax.grad(lambda a, b: jnp.mean(cnn_seq(x, a, b) ** 2), argnums=(0, 1))(w1, w2)


def cnn_grads_local(x, w1, w2):
    return jax.grad(lambda a, b: jnp.mean(cnn_local(x, a, b) ** 2), argnums=(0, 1))(w1, w2)


@dlverify.case
def conv_channel_parallel_grads():
    return dlverify.Case(seq=cnn_grads_seq,
                         dist=_cnn_dist(cnn_grads_local, out_specs=(P("tp"), P(None, "tp"))),
                         args=_cnn_args(), expect="verified",
                         description="weight gradients of the channel-parallel convs; TP=2")


# -- data parallel with synchronised batch norm -----------------------------------

DP, EPS = 4, 1e-5


def _bn(y, mean, var, g, b):
    def per_channel(v):
        return v[None, :, None, None]
    return (y - per_channel(mean)) * lax.rsqrt(per_channel(var) + EPS) * per_channel(g) + per_channel(b)


def _bn_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B * DP, C, H, W), f32), jax.ShapeDtypeStruct((C1, C, 3, 3), f32),
            jax.ShapeDtypeStruct((C1,), f32), jax.ShapeDtypeStruct((C1,), f32))


def bn_seq(x, w, g, b):
    y = _conv(x, w * HE1)
    mean = jnp.mean(y, axis=(0, 2, 3))
    var = jnp.mean((y - mean[None, :, None, None]) ** 2, axis=(0, 2, 3))
    return jax.nn.relu(_bn(y, mean, var, g, b))


def bn_local(x, w, g, b):
    """SyncBatchNorm: the batch statistics summed over 'dp' before they are used."""
    y = _conv(x, w * HE1)
    n = y.shape[0] * y.shape[2] * y.shape[3] * DP          # elements per channel, all ranks
    mean = lax.psum(jnp.sum(y, axis=(0, 2, 3)), "dp") / n
    var = lax.psum(jnp.sum((y - mean[None, :, None, None]) ** 2, axis=(0, 2, 3)), "dp") / n
    return jax.nn.relu(_bn(y, mean, var, g, b))


def bn_local_unsynced(x, w, g, b):
    y = _conv(x, w * HE1)
    mean = jnp.mean(y, axis=(0, 2, 3))  # BUG: this rank's batch statistics (BatchNorm not synchronised)
    var = jnp.mean((y - mean[None, :, None, None]) ** 2, axis=(0, 2, 3))
    return jax.nn.relu(_bn(y, mean, var, g, b))


def _bn_dist(fn):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("dp"), P(), P(), P()),
                                 out_specs=P("dp"), check_vma=False))


@dlverify.case
def conv_data_parallel_sync_bn():
    return dlverify.Case(seq=bn_seq, dist=_bn_dist(bn_local), args=_bn_args(), expect="verified",
                         description="conv + synchronised batch norm, batch split over 'dp'; DP=4")


@dlverify.case
def conv_data_parallel_bug_unsynced_bn():
    return dlverify.Case(seq=bn_seq, dist=_bn_dist(bn_local_unsynced), args=_bn_args(),
                         expect="bug", description="batch norm statistics of the local batch only")


def dp_grads_seq(x, w, g, b):
    return jax.grad(lambda w_: jnp.mean(jax.nn.relu(_conv(x, w_ * HE1)) ** 2))(w)


def dp_grads_local(x, w, g, b):
    gw = jax.grad(lambda w_: jnp.mean(jax.nn.relu(_conv(x, w_ * HE1)) ** 2))(w)
    return lax.pmean(gw, "dp")                    # each rank's mean loss: their mean


@dlverify.case
def conv_data_parallel_grads():
    mesh = dlverify.host_mesh((DP,), ("dp",))
    dist = jax.jit(jax.shard_map(dp_grads_local, mesh=mesh, in_specs=(P("dp"), P(), P(), P()),
                                 out_specs=P(), check_vma=False))
    return dlverify.Case(seq=dp_grads_seq, dist=dist, args=_bn_args(), expect="verified",
                         description="the kernel gradient of a conv, batch split over 'dp', pmean; DP=4")


# -- causal depthwise conv1d over a split sequence -----------------------------

def _seq_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B, D, L), f32), jax.ShapeDtypeStruct((D, 1, K), f32))


def causal_conv(x, w):
    """Depthwise causal conv (Mamba's conv1d): K-1 zeros before the sequence."""
    return lax.conv_general_dilated(x, w, (1,), ((K - 1, 0),), feature_group_count=D)


def causal_seq(x, w):
    return jax.nn.silu(causal_conv(x, w))


def _halo_from(x, shift):
    """The last K-1 positions of rank r - shift (zeros where there is none)."""
    tail = x[:, :, LOCAL - (K - 1):]
    pairs = [(r, r + shift) for r in range(SP) if 0 <= r + shift < SP]
    return lax.ppermute(tail, "sp", pairs)


def _valid_conv(x, w):
    return lax.conv_general_dilated(x, w, (1,), "VALID", feature_group_count=D)


def causal_local(x, w):
    halo = _halo_from(x, 1)                               # from rank r - 1
    return jax.nn.silu(_valid_conv(jnp.concatenate([halo, x], axis=2), w))


def causal_local_wrong_neighbour(x, w):
    wrong = [(r, r - 1) for r in range(1, SP)]
    xh = jnp.concatenate([lax.ppermute(x[:, :, LOCAL - (K - 1):], "sp", wrong), x], axis=2)  # BUG: halo from rank r + 1
    return jax.nn.silu(_valid_conv(xh, w))


def causal_local_restarts(x, w):
    return jax.nn.silu(lax.conv_general_dilated(x, w, (1,), ((K - 1, 0),), feature_group_count=D))  # BUG: every shard padded with zeros, no halo


def _causal_dist(fn):
    mesh = dlverify.host_mesh((SP,), ("sp",))
    spec = P(None, None, "sp")
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec, P()), out_specs=spec))


@dlverify.case
def causal_conv_halo():
    return dlverify.Case(seq=causal_seq, dist=_causal_dist(causal_local), args=_seq_args(),
                         expect="verified",
                         description="causal depthwise conv1d, sequence split, halo by ppermute; SP=4")


@dlverify.case
def causal_conv_bug_wrong_neighbour():
    return dlverify.Case(seq=causal_seq, dist=_causal_dist(causal_local_wrong_neighbour),
                         args=_seq_args(), expect="bug",
                         description="the halo comes from the next rank instead of the previous one")


@dlverify.case
def causal_conv_bug_restarts_per_shard():
    return dlverify.Case(seq=causal_seq, dist=_causal_dist(causal_local_restarts),
                         args=_seq_args(), expect="bug",
                         description="each shard zero-padded on its own: the conv restarts per shard")


def causal_grads_seq(x, w):
    return jax.grad(lambda b: jnp.sum(causal_seq(x, b) ** 2))(w)


def causal_grads_local(x, w):
    # w enters replicated: under check_vma its gradient is summed over 'sp' by
    # jax.grad itself (the transpose of the implicit pvary is a psum)
    return jax.grad(lambda b: jnp.sum(causal_local(x, b) ** 2))(w)


@dlverify.case
def causal_conv_halo_kernel_grad():
    mesh = dlverify.host_mesh((SP,), ("sp",))
    dist = jax.jit(jax.shard_map(causal_grads_local, mesh=mesh,
                                 in_specs=(P(None, None, "sp"), P()), out_specs=P()))
    return dlverify.Case(seq=causal_grads_seq, dist=dist, args=_seq_args(), expect="verified",
                         description="the kernel gradient of the halo conv (summed over 'sp' by jax.grad); SP=4")


def causal_grads_wrong_neighbour(x, w):
    def loss(b):
        wrong = [(r, r - 1) for r in range(1, SP)]
        xh = jnp.concatenate([lax.ppermute(x[:, :, LOCAL - (K - 1):], "sp", wrong), x], axis=2)  # BUG: halo from rank r + 1
        return jnp.sum(jax.nn.silu(_valid_conv(xh, b)) ** 2)
    return jax.grad(loss)(w)


@dlverify.case
def causal_conv_kernel_grad_bug_wrong_neighbour():
    mesh = dlverify.host_mesh((SP,), ("sp",))
    dist = jax.jit(jax.shard_map(causal_grads_wrong_neighbour, mesh=mesh,
                                 in_specs=(P(None, None, "sp"), P()), out_specs=P()))
    return dlverify.Case(seq=causal_grads_seq, dist=dist, args=_seq_args(), expect="bug",
                         description="the kernel gradient of the halo conv, the halo from the next rank")


# -- 2-D halo exchange ----------------------------------------------------------

def _img_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B, C, H, W), f32), jax.ShapeDtypeStruct((C1, C, 3, 3), f32))


def img_seq(x, w):
    return _conv(x, w)


def _rows(x):
    above = lax.ppermute(x[:, :, -1:], "sp", [(r, r + 1) for r in range(SP - 1)])   # row of rank r-1
    below = lax.ppermute(x[:, :, :1], "sp", [(r + 1, r) for r in range(SP - 1)])    # row of rank r+1
    return above, below


def img_local(x, w):
    above, below = _rows(x)
    xh = jnp.concatenate([above, x, below], axis=2)
    return _conv(xh, w, padding=((0, 0), (1, 1)))


def img_local_swapped(x, w):
    above, below = _rows(x)
    xh = jnp.concatenate([below, x, above], axis=2)  # BUG: the halo rows swapped (below on top)
    return _conv(xh, w, padding=((0, 0), (1, 1)))


def _img_dist(fn):
    mesh = dlverify.host_mesh((SP,), ("sp",))
    spec = P(None, None, "sp")
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(spec, P()), out_specs=spec))


@dlverify.case
def conv2d_row_halo():
    return dlverify.Case(seq=img_seq, dist=_img_dist(img_local), args=_img_args(),
                         expect="verified",
                         description="3x3 SAME conv on image rows split over 'sp', halo rows by ppermute; SP=4")


@dlverify.case
def conv2d_row_halo_bug_swapped():
    return dlverify.Case(seq=img_seq, dist=_img_dist(img_local_swapped), args=_img_args(),
                         expect="bug", description="the halo rows above and below swapped")


# -- ViT patch embedding ------------------------------------------------------------

PATCH, EMBED = 4, 8


def _vit_args():
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B, H, W, C), f32), jax.ShapeDtypeStruct((PATCH, PATCH, C, EMBED), f32))


def patch_embed(x, w):
    y = lax.conv_general_dilated(x, w, (PATCH, PATCH), "VALID",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y.reshape(B, -1, y.shape[-1])          # (batch, patches, embed)


@dlverify.case
def vit_patch_embed_tp():
    mesh = dlverify.host_mesh((TP,), ("tp",))
    dist = jax.jit(jax.shard_map(patch_embed, mesh=mesh, in_specs=(P(), P(None, None, None, "tp")),
                                 out_specs=P(None, None, "tp")))
    return dlverify.Case(seq=patch_embed, dist=dist, args=_vit_args(), expect="verified",
                         description="ViT patch embedding, embedding dim split over 'tp'; TP=2")
