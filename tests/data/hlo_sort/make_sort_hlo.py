"""Writes the HLO modules of this folder (run from anywhere with the project's
venv; see README.md): JAX sorts and top-k on f32[4,8], before optimisations
(`jax.jit(f).lower(x).as_text(dialect="hlo")`, `*_pre.hlo`) and after
(`.compile().as_text()`, `*_post.hlo`), and a jit-partitioned pair: the
sequential module of `rows` and its module after the `spmd-partitioning` pass
with x sharded by rows over 2 devices (`rows_seq.hlo`, `rows_dist.hlo`)."""
import os

os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 "
                           "--xla_enable_rgv3_materialization=false")

from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from dlverify.frontends.jax_compiled import _dump  # noqa: E402

HERE = Path(__file__).resolve().parent

FUNCTIONS = {
    "sort": lambda x: jnp.sort(x, axis=-1),
    "argsort": lambda x: jnp.argsort(x, axis=-1),
    "argsort_desc": lambda x: jnp.argsort(x, axis=-1, descending=True),
    "lax_sort2": lambda x: lax.sort((x, x * 2.0), dimension=1, num_keys=1),
    "top_k": lambda x: lax.top_k(x, 3),
}


def rows(x):
    """Sorts, argsorts and top-k along dim 1; the distributed module holds rows whole."""
    v, i = lax.top_k(x, 3)
    return jnp.sort(x, axis=1), jnp.argsort(x, axis=1), v, i


def main() -> None:
    x = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    for name, f in FUNCTIONS.items():
        lowered = jax.jit(f).lower(x)
        (HERE / f"{name}_pre.hlo").write_text(lowered.as_text(dialect="hlo"))
        (HERE / f"{name}_post.hlo").write_text(lowered.compile().as_text())
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    jf = jax.jit(rows, in_shardings=NamedSharding(mesh, P("x", None)),
                 out_shardings=NamedSharding(mesh, P("x", None)))
    (HERE / "rows_seq.hlo").write_text(jax.jit(rows).lower(x).as_text(dialect="hlo"))
    (HERE / "rows_dist.hlo").write_text(_dump(jf.lower(x), "rows")["after_spmd"])


if __name__ == "__main__":
    main()
