"""Regenerate the XLA dumps of this folder (see README.md).

Run from the project root: `python tests/data/xla_optimized/make_dumps.py`.
Each program is jitted with shardings over 4 CPU host devices and dumped with
`--xla_dump_to`; the module before optimisations (global shapes) and the
module after optimisations (the per-device program) are copied here.
"""
import os
import shutil
import sys
import tempfile
from pathlib import Path

DUMP = tempfile.mkdtemp(prefix="dlverify-xla-opt-")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count=4 --xla_dump_to={DUMP}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

HERE = Path(__file__).resolve().parent


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def attention(q, k, v):
    return jax.nn.softmax(q @ k.T / 8.0, axis=-1) @ v


def reshape_sum(y):
    return y.reshape(8, 64).sum(1)


def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def main() -> None:
    mesh = Mesh(jax.devices()[:4], ("x",))

    def put(shape, spec):
        return jax.device_put(jnp.ones(shape, jnp.float32), NamedSharding(mesh, spec))
    programs = {
        "softmax": (softmax, [put((8, 16), P("x", None))]),
        "attention": (attention, [put((8, 16), P("x", None)), put((8, 16), P()),
                                  put((8, 16), P())]),
        "reshape_sum": (reshape_sum, [put((8, 16, 4), P(None, None, "x"))]),
        "mlp": (mlp, [put((8, 16), P()), put((16, 32), P(None, "x")), put((32, 16), P("x", None))]),
    }
    for name, (fn, args) in programs.items():
        jax.jit(fn)(*args).block_until_ready()
        (before,) = Path(DUMP).glob(f"module_*.jit_{name}.before_optimizations.txt")
        (after,) = Path(DUMP).glob(f"module_*.jit_{name}.cpu_after_optimizations.txt")
        shutil.copy(before, HERE / f"{name}.before.hlo")
        shutil.copy(after, HERE / f"{name}.after.hlo")
    shutil.rmtree(DUMP)
    print(f"jax {jax.__version__}: wrote {len(programs)} pairs to {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()
