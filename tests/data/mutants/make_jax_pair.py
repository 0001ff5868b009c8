"""Writes jax_flatten_seq.hlo and jax_flatten_dist.hlo (run from anywhere with
the project's venv): a JAX program whose SPMD-partitioned module all-gathers a
column-sharded matrix along dim 1 before flattening it. The all-gather mutant
(jax_flatten_wrong_gather_dim.hlo) is this dist module with one instruction
edited by hand (see README.md).

    f(x, w) = tanh(x).reshape(-1) * w,  x: f32[4,8] sharded P(None, "x") over 2 devices,
    w: f32[32] replicated, output replicated
"""
import os

os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                           "--xla_enable_rgv3_materialization=false")

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from dlverify.frontends.jax_compiled import _dump  # noqa: E402

HERE = Path(__file__).resolve().parent


def f(x, w):
    return jnp.tanh(x).reshape(-1) * w


def main() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    x, w = jax.ShapeDtypeStruct((4, 8), jnp.float32), jax.ShapeDtypeStruct((32,), jnp.float32)
    jf = jax.jit(f, in_shardings=(NamedSharding(mesh, P(None, "x")), NamedSharding(mesh, P())),
                 out_shardings=NamedSharding(mesh, P()))
    (HERE / "jax_flatten_seq.hlo").write_text(jax.jit(f).lower(x, w).as_text(dialect="hlo"))
    (HERE / "jax_flatten_dist.hlo").write_text(_dump(jf.lower(x, w), "f")["after_spmd"])


if __name__ == "__main__":
    main()
