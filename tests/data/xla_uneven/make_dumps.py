"""Regenerate the XLA dumps of this folder (see README.md).

Run from the project root: `python tests/data/xla_uneven/make_dumps.py`.
Each program is jitted over 4 CPU host devices with a sharding constraint on a
dim that 4 does not divide (10 rows, 30 hidden units, a vocabulary of 10), so
XLA's SPMD partitioner pads the dim to a multiple of 4, gives each device a
block of ceil(n / 4), and masks the padding where it would change a result.
The module before optimisations (global shapes) and the module after them (the
per-device program) are copied here.
"""
import os
import shutil
import sys
import tempfile
from pathlib import Path

DUMP = tempfile.mkdtemp(prefix="dlverify-xla-uneven-")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count=4 --xla_dump_to={DUMP}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = Path(__file__).resolve().parent
MESH = Mesh(jax.devices()[:4], ("x",))


def _shard(x, spec):
    return jax.lax.with_sharding_constraint(x, NamedSharding(MESH, spec))


def masked_sum(x):
    """Rows 10 over 4 devices: tanh per row block, then a sum over the rows."""
    return jnp.sum(_shard(jnp.tanh(x), P("x", None)), axis=0)


def mlp(x, w1, w2):
    """A hidden layer of 30 units over 4 devices: padded columns, then rows of w2."""
    h = _shard(jax.nn.gelu(x @ w1), P(None, "x"))
    return h @ w2


def row_scale(x, b):
    """Rows 10 over 4 devices, scaled and shifted per row, gathered back."""
    y = _shard(x * 2.0 + b, P("x", None))
    return _shard(jnp.exp(y), P())


def logsumexp(x, w):
    """A vocabulary of 10 over 4 devices: the max and the sum over padded logits."""
    logits = _shard(x @ w, P(None, "x"))
    return jax.nn.logsumexp(logits, axis=-1)


def padded_mlp_seq(x, w1, w2):
    """The sequential MLP of 30 hidden units."""
    return jax.nn.gelu(x @ w1) @ w2


def padded_mlp_dist(x, w1p, w2p):
    """The same MLP over 4 devices with weights stored padded to 32 hidden units
    (zero columns of w1, zero rows of w2), as transformers-neuronx pads heads."""
    def local(x, w1, w2):
        return jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "x")
    return jax.shard_map(local, mesh=MESH, in_specs=(P(), P(None, "x"), P("x", None)),
                         out_specs=P())(x, w1p, w2p)


HEADS, HEAD_DIM = 6, 4


def padded_heads_seq(x, wq, wk, wv, wo):
    """Attention over 6 heads of 4 (hidden 16, 8 tokens)."""
    def heads(w):
        return (x @ w).reshape(8, -1, HEAD_DIM).transpose(1, 0, 2)
    q, k, v = heads(wq), heads(wk), heads(wv)
    p = jax.nn.softmax(q @ k.transpose(0, 2, 1) / 2.0, axis=-1)
    return (p @ v).transpose(1, 0, 2).reshape(8, -1) @ wo


def padded_heads_dist(x, wq, wk, wv, wo):
    """The same attention over 4 devices, the heads padded to 8 (2 per device) with
    zero weights, as transformers-neuronx pads 32 heads to 36 at TP=6."""
    def local(x, wq, wk, wv, wo):
        return jax.lax.psum(padded_heads_seq(x, wq, wk, wv, wo), "x")
    col, row = P(None, "x"), P("x", None)
    return jax.shard_map(local, mesh=MESH, in_specs=(P(), col, col, col, row),
                         out_specs=P())(x, wq, wk, wv, wo)


def main() -> None:
    def put(shape):
        return jax.device_put(jnp.ones(shape, jnp.float32), NamedSharding(MESH, P()))
    programs = {
        "masked_sum": (masked_sum, [put((10, 8))]),
        "mlp": (mlp, [put((8, 16)), put((16, 30)), put((30, 16))]),
        "row_scale": (row_scale, [put((10, 8)), put((10, 8))]),
        "logsumexp": (logsumexp, [put((4, 16)), put((16, 10))]),
    }
    for name, (fn, args) in programs.items():
        jax.jit(fn)(*args).block_until_ready()
        (before,) = Path(DUMP).glob(f"module_*.jit_{name}.before_optimizations.txt")
        (after,) = Path(DUMP).glob(f"module_*.jit_{name}.cpu_after_optimizations.txt")
        shutil.copy(before, HERE / f"{name}.before.hlo")
        shutil.copy(after, HERE / f"{name}.after.hlo")
    # A pair of two programs: the sequential one before optimisations, the
    # hand-partitioned one (stored padded weights) after them.
    jax.jit(padded_mlp_seq)(put((8, 16)), put((16, 30)), put((30, 16))).block_until_ready()
    def shard(shape, spec):
        return jax.device_put(jnp.ones(shape, jnp.float32), NamedSharding(MESH, spec))
    jax.jit(padded_mlp_dist)(put((8, 16)), shard((16, 32), P(None, "x")),
                             shard((32, 16), P("x", None))).block_until_ready()
    (before,) = Path(DUMP).glob("module_*.jit_padded_mlp_seq.before_optimizations.txt")
    (after,) = Path(DUMP).glob("module_*.jit_padded_mlp_dist.cpu_after_optimizations.txt")
    shutil.copy(before, HERE / "padded_mlp.seq.hlo")
    shutil.copy(after, HERE / "padded_mlp.dist.hlo")
    hd = HEADS * HEAD_DIM
    jax.jit(padded_heads_seq)(put((8, 16)), put((16, hd)), put((16, hd)), put((16, hd)),
                              put((hd, 16))).block_until_ready()
    padded = 8 * HEAD_DIM
    col, row = P(None, "x"), P("x", None)
    jax.jit(padded_heads_dist)(put((8, 16)), shard((16, padded), col), shard((16, padded), col),
                               shard((16, padded), col), shard((padded, 16), row)).block_until_ready()
    (before,) = Path(DUMP).glob("module_*.jit_padded_heads_seq.before_optimizations.txt")
    (after,) = Path(DUMP).glob("module_*.jit_padded_heads_dist.cpu_after_optimizations.txt")
    shutil.copy(before, HERE / "padded_heads.seq.hlo")
    shutil.copy(after, HERE / "padded_heads.dist.hlo")
    shutil.rmtree(DUMP)
    print(f"jax {jax.__version__}: wrote {len(programs) + 2} pairs to {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()
