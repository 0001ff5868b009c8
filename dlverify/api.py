"""The library entry points: verify a Problem, or a pair of JAX functions."""
from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from dlverify import schema as S
from dlverify.engine import EngineName, run_program
from dlverify.engine.facts_io import write_facts_dir
from dlverify.facts import export
from dlverify.passes import fold, share_nullary
from dlverify.problem import Problem
from dlverify.segments import needs_segments, run_segmented
from dlverify.verdict import Judge, Result

REAL_ARITHMETIC_NOTE = ("the verdict is about real arithmetic: sums that the distributed program "
                        "reassociates across ranks may differ from the sequential ones by "
                        "floating-point rounding")


def rules_path() -> Path:
    """The installed datalog/main.dl."""
    return Path(str(resources.files("dlverify.datalog").joinpath("main.dl")))


DEFAULT_WINDOW = 96  # ops per segment (bench/bench_verify.py); smaller graphs run as one fixpoint


def verify_problem(problem: Problem, engine: EngineName = "auto",
                   keep_facts: Path | None = None,
                   timings: dict[str, float] | None = None,
                   window: int = DEFAULT_WINDOW) -> Result:
    timings = dict(timings or {})
    t0 = time.perf_counter()
    share_nullary(problem.seq)
    share_nullary(problem.dist)
    seq_fold = fold(problem.seq, None)
    dist_fold = fold(problem.dist, problem.mesh)
    tables, _values = export(problem, seq_fold, dist_fold)
    timings["export"] = time.perf_counter() - t0
    if keep_facts is not None:
        keep_facts.mkdir(parents=True, exist_ok=True)
    notes = [REAL_ARITHMETIC_NOTE]
    if needs_segments(problem, window):
        if keep_facts is not None:  # the whole problem, replayable as one fixpoint
            write_facts_dir(keep_facts, [r.name for r in S.INPUTS],
                            {r.name: rows for r, rows in tables.items()})
        res = run_segmented(problem, tables, rules_path(), engine, window)
        notes.append(f"evaluated in {res.windows} segments of up to {window} ops")
    else:
        res = run_program(rules_path(), tables, S.OUTPUTS, engine=engine, keep_dir=keep_facts)
    timings["datalog"] = res.seconds
    t1 = time.perf_counter()
    judge = Judge(problem, res.relations)
    verified, outputs, failures = judge.judge()
    timings["report"] = time.perf_counter() - t1
    return Result(
        name=problem.name, verified=verified, outputs=outputs, failures=failures,
        assumptions=list(problem.assumptions), notes=notes, timings=timings,
        fact_count=sum(len(v) for v in tables.values()),
        derived_count=sum(len(v) for v in res.relations.values()), engine=res.engine,
        views=judge.views, problem=problem)


def verify_jax(seq_fn: Callable[..., Any], dist_fn: Callable[..., Any], *args: Any,
               engine: EngineName = "auto", keep_facts: Path | None = None,
               name: str = "", window: int = DEFAULT_WINDOW) -> Result:
    """Prove that `dist_fn` (a shard_map program) computes what `seq_fn` computes
    for all inputs of the shapes of `args` (arrays or jax.ShapeDtypeStructs)."""
    from dlverify.frontends.jaxpr import import_jax  # imports jax: only when needed

    t0 = time.perf_counter()
    problem = import_jax(seq_fn, dist_fn, tuple(args), name=name)
    return verify_problem(problem, engine, keep_facts, {"trace": time.perf_counter() - t0}, window)
