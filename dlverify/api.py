"""The library entry points: verify a Problem, or a pair of JAX functions."""
from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from dlverify import schema as S
from dlverify.diagnosis import Judge
from dlverify.engine import EngineName, run_program
from dlverify.engine.facts_io import write_facts_dir
from dlverify.facts import export
from dlverify.passes import fold, share_nullary
from dlverify.problem import Problem
from dlverify.rewrites import rewrite
from dlverify.segments import SegmentedRun, needs_segments, run_segmented
from dlverify.verdict import Result

REAL_ARITHMETIC_NOTE = ("the verdict is about real arithmetic: sums that the distributed program "
                        "reassociates across ranks may differ from the sequential ones by "
                        "floating-point rounding")


def rules_path() -> Path:
    """The installed datalog/main.dl."""
    return Path(str(resources.files("dlverify.datalog").joinpath("main.dl")))


FULL_FIXPOINT_OPS = 1500  # failing segmented runs up to this size are retried as one fixpoint
DEFAULT_WINDOW = 96  # ops per segment (bench/bench_verify.py); smaller graphs run as one fixpoint


def _evaluate(problem: Problem, tables: dict, engine: EngineName, window: int,
              keep_facts: Path | None):
    """One engine run over the whole problem, or segment by segment when it is large."""
    if needs_segments(problem, window):
        if keep_facts is not None:  # the whole problem, replayable as one fixpoint
            write_facts_dir(keep_facts, [r.name for r in S.INPUTS],
                            {r.name: rows for r, rows in tables.items()})
        return run_segmented(problem, tables, rules_path(), engine, window)
    return run_program(rules_path(), tables, S.OUTPUTS, engine=engine, keep_dir=keep_facts)


def verify_problem(problem: Problem, engine: EngineName = "auto",
                   keep_facts: Path | None = None,
                   timings: dict[str, float] | None = None,
                   window: int = DEFAULT_WINDOW) -> Result:
    timings = dict(timings or {})
    t0 = time.perf_counter()
    rewrite(problem)
    share_nullary(problem.seq)
    share_nullary(problem.dist)
    seq_fold = fold(problem.seq, None)
    dist_fold = fold(problem.dist, problem.mesh)
    tables, _values = export(problem, seq_fold, dist_fold)
    timings["export"] = time.perf_counter() - t0
    if keep_facts is not None:
        keep_facts.mkdir(parents=True, exist_ok=True)
    notes = [REAL_ARITHMETIC_NOTE]
    res = _evaluate(problem, tables, engine, window, keep_facts)
    t1 = time.perf_counter()
    judge = Judge(problem, res.relations)
    verified, outputs, failures = judge.judge()
    timings["report"] = time.perf_counter() - t1
    size = max(len(problem.seq.ops), len(problem.dist.ops))
    if isinstance(res, SegmentedRun):
        notes.append(f"evaluated in {res.windows} segments of up to {window} ops")
        if not verified and size <= FULL_FIXPOINT_OPS:
            # Segments pair a window of distributed ops with the sequential ops at
            # the positions matched so far; programs that revisit earlier work
            # (micro-batches, partitioner-reordered modules) can keep a pair apart.
            # One fixpoint derives a superset of the segments' views: try it.
            timings["datalog_segmented"] = res.seconds
            res = _evaluate(problem, tables, engine, size + 1, None)
            t1 = time.perf_counter()
            judge = Judge(problem, res.relations)
            verified, outputs, failures = judge.judge()
            timings["report"] += time.perf_counter() - t1
            notes.append("then evaluated as one fixpoint, as the segments left outputs unproved")
    timings["datalog"] = res.seconds
    return Result(
        name=problem.name, verified=verified, outputs=outputs, failures=failures,
        assumptions=list(problem.assumptions) + judge.inferred, notes=notes, timings=timings,
        fact_count=sum(len(v) for v in tables.values()),
        derived_count=sum(len(v) for v in res.relations.values()), engine=res.engine,
        views=judge.views, problem=problem)


def verify_jax(seq_fn: Callable[..., Any], dist_fn: Callable[..., Any], *args: Any,
               engine: EngineName = "auto", keep_facts: Path | None = None,
               name: str = "", window: int = DEFAULT_WINDOW) -> Result:
    """Prove that `dist_fn` computes what `seq_fn` computes for all inputs of the
    shapes of `args` (arrays or jax.ShapeDtypeStructs). `dist_fn` is a shard_map
    program, or a `jax.jit(f, in_shardings=..., out_shardings=...)`: then its
    SPMD-partitioned per-device HLO is verified (frontends/jax_compiled.py)."""
    from dlverify.frontends.jax_compiled import import_jax_compiled, uses_shard_map
    from dlverify.frontends.jaxpr import import_jax  # imports jax: only when needed

    t0 = time.perf_counter()
    if not uses_shard_map(dist_fn, tuple(args)):
        problem = import_jax_compiled(seq_fn, dist_fn, tuple(args), name=name)
        return verify_problem(problem, engine, keep_facts, {"compile": time.perf_counter() - t0},
                              window)
    problem = import_jax(seq_fn, dist_fn, tuple(args), name=name)
    return verify_problem(problem, engine, keep_facts, {"trace": time.perf_counter() - t0}, window)
