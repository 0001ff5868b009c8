"""Time per phase (parse, export, Datalog, report) and fact counts of the HLO
pairs: the Neuron Llama layers and the JAX mutant pair.

    python bench/bench_hlo.py                    # every pair, default window
    python bench/bench_hlo.py --pair tp2_layer2  # one pair
    python bench/bench_hlo.py --window 100000    # one fixpoint instead of segments
    python bench/bench_hlo.py --engines clingo souffle-interpreted
                                                 # the engines side by side (Datalog seconds)

parse = reading both files, translating them to the IR, building the Problem
(spec, segmented parameters, elided constants); export = the IR rewrites,
folding and the fact tables; Datalog = the engine (all segments); report =
the verdict (as `dlverify check` runs it: outputs without a relation are
inferred, see dlverify/outputs.py). Peak memory is the process's maximum resident set size.
"""
import argparse
import resource
import sys
import time
from pathlib import Path

from dlverify.api import DEFAULT_WINDOW, verify_problem
from dlverify.hlo_api import hlo_problem, relate_elided_constants
from dlverify.ir import IdAllocator
from dlverify.spec import load_spec
from engine_modes import ENGINE_MODES, side_by_side

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
PAIRS = {
    "tp2_layer1": (DATA / "neuron_llama/tp1_layer1.hlo", DATA / "neuron_llama/tp2_layer1.hlo",
                   DATA / "neuron_llama/tp2.toml"),
    "tp2_layer2": (DATA / "neuron_llama/tp1_layer2.hlo", DATA / "neuron_llama/tp2_layer2.hlo",
                   DATA / "neuron_llama/tp2_layer2.toml"),
    "jax_flatten": (DATA / "mutants/jax_flatten_seq.hlo", DATA / "mutants/jax_flatten_dist.hlo", None),
}


def bench(name: str, engine: str, window: int) -> str:
    seq, dist, spec = PAIRS[name]
    t0 = time.perf_counter()
    problem = hlo_problem(seq, dist, load_spec(spec) if spec else None, None, IdAllocator())
    relate_elided_constants(problem)
    parse = time.perf_counter() - t0
    ops = (len(problem.seq.ops), len(problem.dist.ops))
    res = verify_problem(problem, engine=engine, window=window)
    t = res.timings
    seg = next((n for n in res.notes if n.startswith("evaluated in")), "one fixpoint")
    return (f"{name:<12} {'verified' if res.verified else 'NOT verified':<13} ops {ops[0]:>4}/{ops[1]:<4}"
            f" parse {parse:6.3f}s  export {t['export']:6.3f}s  datalog {t['datalog']:6.3f}s  "
            f"report {t['report']:6.3f}s  facts {res.fact_count:>7}  derived {res.derived_count:>7}  "
            f"engine {res.engine} ({seg})")


def bench_engines(name: str, engines: list[str], window: int) -> str:
    """The engines side by side; each runs on a freshly built problem."""
    seq, dist, spec = PAIRS[name]

    def run(engine: str):
        problem = hlo_problem(seq, dist, load_spec(spec) if spec else None, None, IdAllocator())
        relate_elided_constants(problem)
        return verify_problem(problem, engine=engine, window=window)
    return side_by_side(name, engines, run)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pair", choices=sorted(PAIRS), nargs="*", default=None)
    ap.add_argument("--engine", default="auto", choices=("auto", "clingo", "souffle"))
    ap.add_argument("--window", type=int, default=DEFAULT_WINDOW)
    ap.add_argument("--engines", nargs="+", choices=sorted(ENGINE_MODES), default=None,
                    help="print these engines side by side (Datalog seconds per engine)")
    a = ap.parse_args()
    for name in a.pair or list(PAIRS):
        row = bench_engines(name, a.engines, a.window) if a.engines else bench(name, a.engine, a.window)
        print(row, flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory {peak:.0f} MiB (python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
