"""Time per phase (trace, export, datalog, report) and fact counts.

    python bench/bench_verify.py                 # every example case, and a Megatron MLP stack
    python bench/bench_verify.py --layers 1 8 64 # only the MLP stack at these depths
    python bench/bench_verify.py --engines clingo souffle souffle-interpreted
                                                 # the engines side by side (Datalog seconds)

`souffle` is Soufflé in its default mode (the cached compiled binary, compiled
first when a C++ compiler is present); `souffle-interpreted` its interpreter.

Measured in a fresh process so JAX start-up is not charged to a phase; peak
memory is the process's maximum resident set size.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import dlverify  # noqa: E402
from dlverify.cases import load_cases  # noqa: E402

from engine_modes import ENGINE_MODES, side_by_side  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def mlp_stack(layers: int, tp: int = 4, d: int = 64, f: int = 256, batch: int = 8):
    """`layers` Megatron MLP blocks with residuals; weights stacked per layer."""
    def seq(x, w1, w2):
        for i in range(layers):
            x = x + jax.nn.gelu(x @ w1[i]) @ w2[i]
        return x

    def local(x, w1, w2):
        for i in range(layers):
            x = x + jax.lax.psum(jax.nn.gelu(x @ w1[i]) @ w2[i], "tp")
        return x

    mesh = Mesh(np.array(jax.devices()[:tp]), ("tp",))
    dist = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, None, "tp"), P(None, "tp", None)),
                                 out_specs=P()))
    f32 = jnp.float32
    args = (jax.ShapeDtypeStruct((batch, d), f32), jax.ShapeDtypeStruct((layers, d, f), f32),
            jax.ShapeDtypeStruct((layers, f, d), f32))
    return seq, dist, args


def row(name: str, res, wall: float) -> str:
    t = res.timings
    return (f"{name:<45} {'verified' if res.verified else 'NOT verified':<13} wall {wall:6.2f}s  "
            + "  ".join(f"{k} {t.get(k, 0):6.3f}s" for k in ("trace", "export", "datalog", "report"))
            + f"  facts {res.fact_count:>8}  derived {res.derived_count:>8}")


def run_engines(name: str, seq, dist, a, engines: list[str]) -> str:
    return side_by_side(name, engines, lambda engine: dlverify.verify_jax(seq, dist, *a, engine=engine))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="*", default=None)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--engines", nargs="+", choices=sorted(ENGINE_MODES), default=None,
                    help="print these engines side by side (Datalog seconds per engine)")
    args = ap.parse_args()
    if args.layers is None:
        for path in sorted((ROOT / "examples").rglob("*.py")):
            for name, fn in load_cases(path):
                c = fn()
                if args.engines:
                    print(run_engines(name, c.seq, c.dist, c.args, args.engines), flush=True)
                    continue
                t0 = time.perf_counter()
                res = dlverify.verify_jax(c.seq, c.dist, *c.args, engine=args.engine)
                print(row(name, res, time.perf_counter() - t0), flush=True)
    for layers in args.layers if args.layers is not None else [1, 8, 64]:
        seq, dist, a = mlp_stack(layers)
        if args.engines:
            print(run_engines(f"megatron_mlp_stack layers={layers} tp=4", seq, dist, a, args.engines),
                  flush=True)
            continue
        t0 = time.perf_counter()
        res = dlverify.verify_jax(seq, dist, *a, engine=args.engine)
        print(row(f"megatron_mlp_stack layers={layers} tp=4", res, time.perf_counter() - t0), flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB", file=sys.stderr)


if __name__ == "__main__":
    main()
