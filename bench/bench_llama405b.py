"""The Llama-3 forward at Llama-3.1-405B dimensions, tensor + sequence parallel
over 8 ranks, verified from ShapeDtypeStructs: time and peak memory per phase.

    python bench/bench_llama405b.py                 # all 126 layers
    python bench/bench_llama405b.py --layers 8      # the first 8 layers (same shapes)
    python bench/bench_llama405b.py --layers 2 --seq 1024 --engine clingo
    python bench/bench_llama405b.py --layers 8 --dtype bfloat16 --train --json
    python bench/bench_llama405b.py --engines clingo souffle-interpreted
                                                    # one process per engine, side by side
    python bench/bench_llama405b.py --profile fwd.prof
                                                    # where the time goes: python -m pstats fwd.prof

The model is examples/models/llama3.py with LLAMA31_405B: hidden 16384, 128
query heads in 8 KV groups of head_dim 128 (one group per rank at TP=8), MLP
53248, vocab 128256; float32 parameters (the real model's bfloat16 with
--dtype bfloat16); with --scan-layers the layers are one lax.scan over stacked
weights, verified by induction over one layer (dlverify/induction.py); batch 1 and sequence 4096 by default (no dim reaches 2^31
elements). --train verifies the training step (loss and the gradient of every
parameter) instead of the forward. Nothing is materialised: both programs are
traced from jax.ShapeDtypeStructs and verified symbolically.

Phases: trace (tracing both programs to IR), export (IR passes and fact
tables), datalog (the fixpoint, segment by segment), report (the verdict).
Peak memory per phase is the largest resident set size of this process seen
while the phase ran (sampled every 5 ms; the clingo engine runs in-process,
a Soufflé subprocess would not be counted). Times are wall-clock seconds, and
CPU seconds of this process. The Datalog time is the whole engine time, a retry
as one fixpoint included. With --json one JSON object is printed: per-phase
wall and CPU seconds and peak MiB, facts, segments, engine runs, memo hits and
the verdict.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "models"))

import llama3  # noqa: E402
from engine_modes import ENGINE_MODES  # noqa: E402

from dlverify.api import verify_problem  # noqa: E402
from dlverify.frontends.jaxpr import import_jax  # noqa: E402


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Sampler:
    """Resident set size of this process every `period` seconds, with timestamps."""

    def __init__(self, period: float = 0.005) -> None:
        self.period = period
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), _rss_mib()))
            time.sleep(self.period)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, t0: float, t1: float) -> float:
        inside = [m for t, m in self.samples if t0 <= t <= t1]
        return max(inside, default=_rss_mib())


def _noted_segments(notes: list[str]) -> int:
    """The segment count of a run without a segment plan, from its note."""
    for n in notes:
        m = re.match(r"evaluated in (\d+) segments", n)
        if m:
            return int(m.group(1))
    return 0


def side_by_side(args: argparse.Namespace) -> int:
    """Run this benchmark once per engine label, each in a fresh process (so peak
    memory and start-up are its own), and print one row per engine."""
    from dlverify.engine.souffle_runner import MODE_ENV

    same = ["--layers", str(args.layers), "--seq", str(args.seq), "--batch", str(args.batch),
            "--tp", str(args.tp), "--dtype", args.dtype]
    same += ["--no-sp"] * args.no_sp + ["--train"] * args.train + ["--scan-layers"] * args.scan_layers
    same += ["--window", str(args.window)] if args.window is not None else []
    same += ["--cache", str(args.cache)] if args.cache is not None else []
    status = 0
    for label in args.engines:
        engine, mode = ENGINE_MODES[label]
        env = dict(os.environ)
        env.pop(MODE_ENV, None)
        env.update({MODE_ENV: mode} if mode else {})
        out = subprocess.run([sys.executable, __file__, *same, "--engine", engine, "--json"],
                             env=env, capture_output=True, text=True)
        try:
            r = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            print(f"{label:<20} failed (exit {out.returncode}): {out.stderr.strip()[-300:]}")
            status = 1
            continue
        status |= 0 if r["verified"] else 1
        print(f"{label:<20} {'verified' if r['verified'] else 'NOT verified':<13} "
              f"wall {r['wall_s']:7.2f}s  datalog {r['datalog_s']:7.2f}s  "
              f"segments {r['segments']:>4}  engine runs {r['engine_runs']:>3}  "
              f"memo hits {r['memo_hits']:>4}  peak {r['peak_mib']:7.0f} MiB", flush=True)
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=llama3.LLAMA31_405B.layers)
    ap.add_argument("--seq", type=int, default=llama3.LLAMA31_405B.seq)
    ap.add_argument("--batch", type=int, default=llama3.LLAMA31_405B.batch)
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--no-sp", action="store_true", help="tensor parallel only")
    ap.add_argument("--dtype", default=llama3.LLAMA31_405B.dtype,
                    help="parameter dtype: float32, bfloat16 or float16")
    ap.add_argument("--train", action="store_true", help="the training step, not the forward")
    ap.add_argument("--scan-layers", action="store_true",
                    help="layer weights stacked and the layers a lax.scan (MaxText style)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--cache", type=Path, default=None, help="on-disk segment cache directory")
    ap.add_argument("--engine", default="auto", choices=["auto", "clingo", "souffle"])
    ap.add_argument("--window", type=int, default=None, help="ops per datalog segment")
    ap.add_argument("--profile", type=Path, default=None, metavar="FILE.prof",
                    help="write cProfile statistics of tracing and verifying to FILE.prof "
                         "(read with python -m pstats; the times it reports are inflated)")
    ap.add_argument("--engines", nargs="+", choices=sorted(ENGINE_MODES), default=None,
                    help="run once per engine (a fresh process each) and print them side by side")
    args = ap.parse_args()
    if args.engines:
        return side_by_side(args)

    cfg = llama3.LLAMA31_405B._replace(layers=args.layers, seq=args.seq, batch=args.batch,
                                       dtype=args.dtype, scan_layers=args.scan_layers)
    sp = not args.no_sp
    say = (lambda *a, **k: None) if args.json else print
    say(f"Llama-3.1-405B shapes: {cfg.layers} layers, hidden {cfg.d_model}, {cfg.heads} heads / "
        f"{cfg.kv_heads} KV heads x {cfg.head_dim}, MLP {cfg.d_ff}, vocab {cfg.vocab}, "
        f"batch {cfg.batch} x seq {cfg.seq}, {cfg.dtype}; TP={args.tp}{' + SP' if sp else ''}"
        f"{'; training step' if args.train else ''}{'; layers as lax.scan' if args.scan_layers else ''}",
        flush=True)
    case = llama3.make_case(args.tp, sp=sp, train=args.train, cfg=cfg)
    kw = {} if args.window is None else {"window": args.window}
    if args.cache is not None:
        kw["cache_dir"] = args.cache
    profiler = None
    if args.profile is not None:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    cpu0 = time.process_time()

    with Sampler() as smp:
        t0 = time.perf_counter()
        problem = import_jax(case.seq, case.dist, case.args, name=f"llama405b_{cfg.layers}l")
        t1 = time.perf_counter()
        cpu_trace = time.process_time() - cpu0
        res = verify_problem(problem, engine=args.engine, timings={"trace": t1 - t0}, **kw)
        t2 = time.perf_counter()
    cpu_total = time.process_time() - cpu0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(str(args.profile))

    # verify_problem runs export, datalog and report in that order (a retry as one
    # fixpoint sits inside the datalog phase): cut the samples at its phase times.
    tm = dict(res.timings)
    # (a summarised attempt that did not verify, before the scans were unrolled, included)
    datalog_total = tm.get("datalog", 0.0) + tm.get("datalog_segmented", 0.0) + \
        tm.get("induction_attempt", 0.0)
    bounds = {"trace": (t0, t1)}
    start = t1
    for phase, secs in (("export", tm.get("export", 0.0)), ("datalog", datalog_total),
                        ("report", tm.get("report", 0.0))):
        bounds[phase] = (start, start + secs)
        start += secs
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               max((m for _, m in smp.samples), default=0.0))
    plan = res.segment_plan
    report = {
        "model": "llama3.1-405b-shapes", "layers": cfg.layers, "dtype": cfg.dtype,
        "train": args.train, "scan_layers": args.scan_layers, "tp": args.tp, "sp": sp,
        "seq": cfg.seq, "batch": cfg.batch,
        "ops": {"sequential": len(problem.seq.ops), "distributed": len(problem.dist.ops)},
        # the bodies of the scans verified by induction (exported once, whatever the depth)
        "scan_body_ops": [{"sequential": len(sc.body.seq.ops), "distributed": len(sc.body.dist.ops)}
                          for sc in res.problem.scans],
        "phases": {p: {"wall_s": round(b - a, 3), "peak_mib": round(smp.peak(a, b), 1)}
                   for p, (a, b) in bounds.items()},
        "wall_s": round(t2 - t0, 3), "cpu_s": round(cpu_total, 3),
        "cpu_trace_s": round(cpu_trace, 3), "cpu_verify_s": round(cpu_total - cpu_trace, 3),
        "datalog_s": round(datalog_total, 3),
        "retried_as_one_fixpoint": "datalog_segmented" in tm,
        "peak_mib": round(peak, 1), "facts": res.fact_count, "derived": res.derived_count,
        "segments": len(plan.segments) if plan else _noted_segments(res.notes),
        "engine_runs": plan.engine_runs if plan else 1,
        "memo_hits": plan.memo_hits if plan else 0,
        "cache_hits": plan.cache_hits if plan else 0,
        "engine": res.engine, "verified": res.verified,
        # scans concluded by induction over one body (dlverify/induction.py), or why unrolled
        "inductions": plan.inductions if plan else [],
        "notes": res.notes[1:],
        "profiled": profiler is not None,
    }
    if args.json:
        print(json.dumps(report))
        return 0 if res.verified else 1
    print(f"ops: sequential {len(problem.seq.ops)}, distributed {len(problem.dist.ops)} "
          f"(x {problem.mesh.size} ranks); facts {res.fact_count}, derived {res.derived_count}, "
          f"engine {res.engine}", flush=True)
    for phase, (a, b) in bounds.items():
        print(f"  {phase:<8} {b - a:9.2f} s   peak RSS {smp.peak(a, b):8.0f} MiB")
    print(f"  {'total':<8} {t2 - t0:9.2f} s   peak RSS {peak:8.0f} MiB (process maximum); "
          f"CPU {cpu_total:.2f} s")
    if plan is not None:
        print(f"  segments {len(plan.segments)}: {plan.engine_runs} engine runs, "
              f"{plan.memo_hits} memo hits ({plan.cache_hits} from the cache)")
        for line in plan.inductions:
            print(f"  induction: {line}")
    for note in res.notes[1:]:
        print(f"  note: {note}")
    print(f"verdict: {'verified' if res.verified else 'NOT verified'}")
    for o in res.outputs:
        print(f"  {o}")
    for f in res.failures[:5]:
        print(f"  {f.op} at {Path(f.file).name}:{f.line}: {f.message[:300]}")
    if len(res.failures) > 5:
        print(f"  ... and {len(res.failures) - 5} more failures")
    return 0 if res.verified else 1


if __name__ == "__main__":
    sys.exit(main())
