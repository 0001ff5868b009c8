"""Regenerate the HLO pairs of this folder (see README.md).

Run from the project root: `python tests/data/xla_resharding/make_dumps.py`.
A two-layer MLP's training step (loss and the gradients of both weights) is
jitted with FSDP shardings over 4 CPU host devices (batch and both weights
split along dim 0); XLA's SPMD partitioner reshards activations and gradients
between dims with all-to-all chains. Written: the sequential module (the
function lowered on one device), the per-device module right after the
`spmd-partitioning` pass, and that module with one edit (MUTATION) that must
not verify.
"""
import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=4")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))
from dlverify.frontends.jax_compiled import _dump  # noqa: E402

# fsdp_mlp.dist_mutated.hlo: the first resharding's all-to-all exchanges along the
# wrong dim (the 8 columns of each piece instead of the 4 pieces; the same shape),
# so each rank receives other columns than it multiplies
MUTATION = ("all-to-all(%reshape.1), channel_id=5, replica_groups=[1,4]<=[4], dimensions={1}",
            "all-to-all(%reshape.1), channel_id=5, replica_groups=[1,4]<=[4], dimensions={2}")


def loss(x, w1, w2, y):
    h = jax.nn.gelu(x @ w1)
    return jnp.mean((h @ w2 - y) ** 2)


def step(x, w1, w2, y):
    value, grads = jax.value_and_grad(loss, argnums=(1, 2))(x, w1, w2, y)
    return value, grads[0], grads[1]


def main() -> None:
    mesh = Mesh(np.array(jax.devices()[:4]), ("dp",))
    specs = (P("dp"), P("dp", None), P("dp", None), P("dp"))
    args = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 32), jnp.float32),
            jax.ShapeDtypeStruct((32, 16), jnp.float32), jax.ShapeDtypeStruct((8, 16), jnp.float32))
    jitted = jax.jit(step, in_shardings=tuple(NamedSharding(mesh, s) for s in specs))
    dist = _dump(jitted.lower(*args), "fsdp_mlp")["after_spmd"]
    seq = jax.jit(step).lower(*args).as_text(dialect="hlo")
    (HERE / "fsdp_mlp.seq.hlo").write_text(seq)
    (HERE / "fsdp_mlp.dist.hlo").write_text(dist)
    old, new = MUTATION
    assert dist.count(old) == 1, f"the mutation site {old!r} is not unique"
    (HERE / "fsdp_mlp.dist_mutated.hlo").write_text(dist.replace(old, new))


if __name__ == "__main__":
    main()
