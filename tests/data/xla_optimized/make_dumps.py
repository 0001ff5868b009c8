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
# NAME.after_mutated.hlo: NAME.after.hlo with one edit (README.md), which must not verify
MUTATIONS = {
    "softmax": ("fusion(%subtract_exponential_fusion, %reduce_divide_fusion)",
                "fusion(%param, %reduce_divide_fusion)"),
    "gpt2_forward": ("subtract(%add.168, %sub.91)", "subtract(%param_1.89, %sub.91)"),
    "llama3_forward": ("power(%broadcast.65, %negate.1)", "power(%broadcast.65, %multiply.31)"),
    "layer_norm_grad": ("add(%add_any.14, %mul.69)", "add(%add_any.14, %mul.72)"),
    "llama3_kv1_forward": ("transpose(%multiply.28), dimensions={0,1,4,2,3}",
                           "transpose(%multiply.28), dimensions={0,1,3,2,4}"),
    "reshape_sum": ("copy(%param_0.2)", "multiply(%param_0.2, %param_0.2)"),
}


def softmax(x):
    return jax.nn.softmax(x, axis=-1)


def attention(q, k, v):
    return jax.nn.softmax(q @ k.T / 8.0, axis=-1) @ v


def reshape_sum(y):
    return y.reshape(8, 64).sum(1)


def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def layer_norm_grad(x, g):
    """The gradient in x of a LayerNorm written as GPT-2 writes it (`xc * xc`: its
    transpose adds xc * ct and ct * xc, XLA computes the product once)."""
    def loss(x, g):
        xc = x - jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(xc * xc, axis=-1, keepdims=True)
        return jnp.sum(jnp.tanh(xc * jax.lax.rsqrt(var + 1e-5) * g))
    return jax.grad(loss)(x, g)


def model_programs():
    """The sequential forwards (logits and loss) of examples/models/gpt2.py and
    llama3.py (and GPT-2's training step, Llama with one KV head per rank), one
    layer, jitted with their param_specs over a 4-device mesh axis
    'tp' (Megatron layouts: XLA's partitioner makes the per-device program)."""
    sys.path.insert(0, str(HERE.parents[2]))
    from examples.models import gpt2, llama3
    mesh = Mesh(jax.devices()[:4], ("tp",))
    gcfg, lcfg = gpt2.SMALL._replace(layers=1), llama3.SMALL._replace(layers=1)
    kv1 = lcfg._replace(kv_heads=4)                              # one KV head per rank
    models = {"gpt2_forward": (gpt2, gcfg, gpt2.param_specs(gcfg), False),
              "gpt2_train": (gpt2, gcfg, gpt2.param_specs(gcfg), True),
              "llama3_forward": (llama3, lcfg, llama3.param_specs(lcfg, 4), False),
              "llama3_kv1_forward": (llama3, kv1, llama3.param_specs(kv1, 4), False)}
    out = {}
    for name, (model, cfg, specs, train) in models.items():
        shardings = list(specs.values()) + [P(), P()]          # token ids and labels replicated
        args = [jax.device_put(jnp.ones(a.shape, a.dtype), NamedSharding(mesh, s))
                for a, s in zip(model.args(cfg), shardings)]
        fwd = model.make_seq(cfg, train=train)

        def program(*flat, fwd=fwd):
            return fwd(*flat)
        program.__name__ = name                                  # the dump files' names
        out[name] = (program, args)
    return out


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
        "layer_norm_grad": (layer_norm_grad, [put((8, 16), P("x", None)), put((16,), P())]),
        **model_programs(),
    }
    for name, (fn, args) in programs.items():
        jax.block_until_ready(jax.jit(fn)(*args))
        (before,) = Path(DUMP).glob(f"module_*.jit_{name}.before_optimizations.txt")
        (after,) = Path(DUMP).glob(f"module_*.jit_{name}.cpu_after_optimizations.txt")
        shutil.copy(before, HERE / f"{name}.before.hlo")
        shutil.copy(after, HERE / f"{name}.after.hlo")
        if name in MUTATIONS:
            old, new = MUTATIONS[name]
            text = after.read_text()
            assert text.count(old) == 1, (name, old)
            (HERE / f"{name}.after_mutated.hlo").write_text(text.replace(old, new))
    shutil.rmtree(DUMP)
    print(f"jax {jax.__version__}: wrote {len(programs)} pairs to {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()
