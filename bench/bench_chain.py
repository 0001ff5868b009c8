"""Deep chains of elementwise ops: time per phase against the chain's length.

    python bench/bench_chain.py                       # 10,000 and 100,000 ops, HLO text
    python bench/bench_chain.py --ops 100000 --frontend jax --json
    python bench/bench_chain.py --ops 100 200 400 --frontend jax --scaled --engine clingo --window 100000

The HLO chain cycles multiply, add and tanh on one f32[8,4] value split over 2
ranks (tests/test_depth.py builds the same module); the JAX chain is a
shard_map of x = tanh(x) unrolled in Python (with --scaled, x = tanh(x) * 2.0). A linear schedule shows as a
constant time per op across lengths. With --json one JSON object per length is
printed: per-phase wall and CPU seconds, segments, engine runs, memo hits, peak
MiB and the verdict.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_depth import chain_hlo  # noqa: E402

from dlverify.api import verify_problem  # noqa: E402
from dlverify.hlo_api import hlo_problem  # noqa: E402
from dlverify.ir import IdAllocator  # noqa: E402
from dlverify.spec import load_spec  # noqa: E402


class Clock:
    """Wall and CPU seconds of consecutive phases."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = {}
        self._w, self._c = time.perf_counter(), time.process_time()

    def lap(self, name: str) -> None:
        w, c = time.perf_counter(), time.process_time()
        self.phases[name] = {"wall_s": round(w - self._w, 3), "cpu_s": round(c - self._c, 3)}
        self._w, self._c = w, c


def load_hlo(ops: int, tmp: Path):
    seq, dist, spec = tmp / "seq.hlo", tmp / "dist.hlo", tmp / "spec.toml"
    seq.write_text(chain_hlo("chain_seq", (8, 4), ops))
    dist.write_text(chain_hlo("chain_dist", (4, 4), ops))
    spec.write_text("ranks = 2\n[params]\n0 = { split = 0 }\n[outputs]\n0 = { concat = 0 }\n")
    return hlo_problem(seq, dist, load_spec(spec), None, IdAllocator())


def load_jax(ops: int, scaled: bool = False):
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import dlverify
    from dlverify.frontends.jaxpr import import_jax

    def chain(x):
        for _ in range(ops):
            x = jnp.tanh(x) * 2.0 if scaled else jnp.tanh(x)
        return x

    mesh = dlverify.host_mesh((2,), ("x",))
    dist = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    return import_jax(chain, dist, (jax.ShapeDtypeStruct((8, 4), jnp.float32),), name="chain")


def run(ops: int, frontend: str, engine: str, window: int | None, scaled: bool = False,
        rules_dir: Path | None = None) -> dict:
    clock = Clock()
    with tempfile.TemporaryDirectory() as tmp:
        problem = load_hlo(ops, Path(tmp)) if frontend == "hlo" else load_jax(ops, scaled)
    clock.lap("import")
    kw = {} if window is None else {"window": window}
    res = verify_problem(problem, engine=engine, rules_dir=rules_dir, **kw)
    clock.lap("verify")
    plan = res.segment_plan
    return {
        "ops": ops, "frontend": frontend, "verified": res.verified,
        "phases": clock.phases,
        "timings_s": {k: round(v, 3) for k, v in res.timings.items()},
        "datalog_total_s": round(res.timings.get("datalog", 0.0)
                                 + res.timings.get("datalog_segmented", 0.0), 3),
        "facts": res.fact_count,
        "segments": len(plan.segments) if plan else 0,
        "engine_runs": plan.engine_runs if plan else 1,
        "memo_hits": plan.memo_hits if plan else 0,
        "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--frontend", choices=["hlo", "jax"], default="hlo")
    ap.add_argument("--engine", default="auto", choices=["auto", "clingo", "souffle"])
    ap.add_argument("--window", type=int, default=None,
                    help="ops per segment (larger than --ops: one fixpoint, as a failing run is retried)")
    ap.add_argument("--scaled", action="store_true",
                    help="jax: x = tanh(x) * 2.0, a constant of the same value in every op")
    ap.add_argument("--rules-dir", type=Path, default=None,
                    help="another rule set (a datalog/ folder) to compare with the installed one")
    ap.add_argument("--json", action="store_true", help="one JSON object per length")
    args = ap.parse_args()
    if args.scaled and args.frontend != "jax":
        ap.error("--scaled applies to the JAX chain (--frontend jax); the HLO chain has its constant")
    ok = True
    for n in args.ops:
        r = run(n, args.frontend, args.engine, args.window, args.scaled, args.rules_dir)
        ok &= r["verified"]
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            per = 1e6 * r["phases"]["verify"]["wall_s"] / n
            print(f"{n:>8} ops ({args.frontend}): import {r['phases']['import']['wall_s']:.2f} s, "
                  f"verify {r['phases']['verify']['wall_s']:.2f} s ({per:.0f} us/op), datalog "
                  f"{r['datalog_total_s']:.2f} s in {r['segments']} segments ({r['engine_runs']} "
                  f"engine runs, {r['memo_hits']} memo hits), peak {r['peak_mib']:.0f} MiB: "
                  f"{'verified' if r['verified'] else 'NOT verified'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
