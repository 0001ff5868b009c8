"""The library entry points: verify a Problem, or a pair of JAX functions."""
from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from dlverify import schema as S
from dlverify.diagnosis import Judge
from dlverify.engine import EngineName, run_program
from dlverify.engine.facts_io import write_facts_dir
from dlverify.errors import EngineError, InputError
from dlverify.facts import export
from dlverify.passes import fold, share_nullary
from dlverify.problem import Problem
from dlverify.pass_order import rewrite
from dlverify.segments import SegmentedRun, needs_segments, run_segmented
from dlverify.verdict import Result

if TYPE_CHECKING:
    from dlverify.patterns import Pattern

REAL_ARITHMETIC_NOTE = ("the verdict is about real arithmetic: sums that the distributed program "
                        "reassociates across ranks may differ from the sequential ones by "
                        "floating-point rounding")


def rules_path() -> Path:
    """The installed datalog/main.dl."""
    return Path(str(resources.files("dlverify.datalog").joinpath("main.dl")))


FULL_FIXPOINT_OPS = 1500  # failing segmented runs up to this size are retried as one fixpoint
DEFAULT_WINDOW = 96  # ops per segment (bench/bench_verify.py); smaller graphs run as one fixpoint


def _evaluate(problem: Problem, tables: dict, engine: EngineName, window: int,
              keep_facts: Path | None, cache_dir: Path | None = None, reporter: Any = None,
              main_dl: Path | None = None):
    """One engine run over the whole problem, or segment by segment when it is
    large (the reporter then hears how far the segments got). `main_dl`: the rules
    (the installed ones when None)."""
    main_dl = main_dl or rules_path()
    if needs_segments(problem, window):
        if keep_facts is not None:  # the whole problem, replayable as one fixpoint
            write_facts_dir(keep_facts, [r.name for r in S.INPUTS],
                            {r.name: rows for r, rows in tables.items()})
        return run_segmented(problem, tables, main_dl, engine, window, cache_dir,
                             progress=reporter.progress if reporter is not None else None)
    return run_program(main_dl, tables, S.OUTPUTS, engine=engine, keep_dir=keep_facts)


def problem_tables(problem: Problem) -> dict:
    """The rewrites and folds every verification applies, then the fact tables."""
    from dlverify.induction import pinned_scan_operands

    with pinned_scan_operands(problem):  # (no op reads a summarised scan's operands)
        rewrite(problem)
        share_nullary(problem.seq)
        share_nullary(problem.dist)
    seq_fold = fold(problem.seq, None)
    dist_fold = fold(problem.dist, problem.mesh)
    tables, _values = export(problem, seq_fold, dist_fold)
    return tables


def verify_problem(problem: Problem, engine: EngineName = "auto",
                   keep_facts: Path | None = None,
                   timings: dict[str, float] | None = None,
                   window: int = DEFAULT_WINDOW, reporter: Any = None,
                   cache_dir: Path | None = None, rules_dir: Path | None = None,
                   patterns: Sequence[Pattern] | None = None) -> Result:
    """Scans summarised by the frontend are verified by induction; a run that is
    not verified that way is verified again with them unrolled (dlverify/induction.py)."""
    from dlverify.gcpause import gc_paused
    from dlverify.induction import verify_with_induction

    with gc_paused():  # (dlverify/gcpause.py: full collections of millions of rows found nothing)
        return verify_with_induction(problem, lambda p: _verify_once(
            p, engine, keep_facts, timings, window, reporter, cache_dir, rules_dir, patterns))


def _verify_once(problem: Problem, engine: EngineName = "auto",
                 keep_facts: Path | None = None,
                 timings: dict[str, float] | None = None,
                 window: int = DEFAULT_WINDOW, reporter: Any = None,
                 cache_dir: Path | None = None, rules_dir: Path | None = None,
                 patterns: Sequence[Pattern] | None = None) -> Result:
    """`reporter` (dlverify.supervise.Reporter) is told the phases. `cache_dir`: an
    on-disk cache of segment results (dlverify/memo.py); off when None. `rules_dir`:
    another rule set (a folder with a main.dl), checked against the schema first.
    `patterns`: the bug patterns matched on a failing verdict (None: the shipped ones;
    README "Bug-pattern queries")."""
    from dlverify.rules.ruleset import checked_main

    main_dl = checked_main(rules_dir)
    def phase(name: str) -> None:
        if reporter is not None:
            reporter.phase(name)

    phase("export")
    timings = dict(timings or {})
    t0 = time.perf_counter()
    tables = problem_tables(problem)
    timings["export"] = time.perf_counter() - t0
    if keep_facts is not None:
        keep_facts.mkdir(parents=True, exist_ok=True)
    notes = [REAL_ARITHMETIC_NOTE] + list(problem.notes)
    phase("engine")
    res = _evaluate(problem, tables, engine, window, keep_facts, cache_dir, reporter, main_dl)
    plan = res.plan if isinstance(res, SegmentedRun) else None
    phase("judge")
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
            phase("engine")
            res = _evaluate(problem, tables, engine, size + 1, None, main_dl=main_dl)
            phase("judge")
            t1 = time.perf_counter()
            judge = Judge(problem, res.relations)
            verified, outputs, failures = judge.judge()
            timings["report"] += time.perf_counter() - t1
            notes.append("then evaluated as one fixpoint, as the segments left outputs unproved")
    timings["datalog"] = res.seconds
    matches = []
    if not verified:   # explanations only: the verdict is settled
        from dlverify.patterns import explain_failure, load_pattern_set
        phase("patterns")
        try:
            matches = explain_failure(problem, judge.views, judge.output_ok,
                                      load_pattern_set() if patterns is None else patterns, engine,
                                      timings)
        except EngineError as e:   # a diagnosis that fails leaves the verdict as it is
            notes.append(f"bug patterns not evaluated: {e}")
    return Result(
        name=problem.name, verified=verified, outputs=outputs, failures=failures,
        assumptions=list(problem.assumptions) + judge.inferred, notes=notes, unknowns=list(problem.unknowns), timings=timings,
        fact_count=sum(len(v) for v in tables.values()),
        derived_count=sum(len(v) for v in res.relations.values()), engine=res.engine,
        views=judge.views, padded_views=judge.padded_views, problem=problem, segment_plan=plan,
        patterns=matches)


def verify_jax(seq_fn: Callable[..., Any], dist_fn: Callable[..., Any], *args: Any,
               engine: EngineName = "auto", keep_facts: Path | None = None,
               name: str = "", window: int = DEFAULT_WINDOW, reporter: Any = None,
               cache_dir: Path | None = None, rules_dir: Path | None = None,
               patterns: Sequence[Pattern] | None = None) -> Result:
    """Prove that `dist_fn` computes what `seq_fn` computes for all inputs of the
    shapes of `args` (arrays or jax.ShapeDtypeStructs). `dist_fn` is a shard_map
    program, or a `jax.jit(f, in_shardings=..., out_shardings=...)`: then its
    SPMD-partitioned per-device HLO is verified (frontends/jax_compiled.py).
    `reporter` (dlverify.supervise.Reporter) is told the phases; `cache_dir`: the
    on-disk segment cache (see verify_problem); `rules_dir`: another rule set;
    `patterns`: the bug patterns (see verify_problem)."""
    t0 = time.perf_counter()
    problem, phase = jax_problem(seq_fn, dist_fn, *args, name=name, reporter=reporter)
    return verify_problem(problem, engine, keep_facts, {phase: time.perf_counter() - t0}, window,
                          reporter=reporter, cache_dir=cache_dir, rules_dir=rules_dir,
                          patterns=patterns)


def jax_problem(seq_fn: Callable[..., Any], dist_fn: Callable[..., Any], *args: Any, name: str = "",
                reporter: Any = None) -> tuple[Problem, str]:
    """The Problem of a pair of JAX functions, and the phase that made it (trace or compile)."""
    from dlverify.frontends.jax_compiled import import_jax_compiled, uses_shard_map
    from dlverify.frontends.jaxpr import import_jax  # imports jax: only when needed

    check_args(args)
    if reporter is not None:
        reporter.phase("trace")
    if not uses_shard_map(dist_fn, tuple(args)):
        if reporter is not None:
            reporter.phase("compile")
        problem = import_jax_compiled(seq_fn, dist_fn, tuple(args), name=name)
        _check_devices(problem)
        return problem, "compile"
    problem = import_jax(seq_fn, dist_fn, tuple(args), name=name)
    _check_devices(problem)
    return problem, "trace"


MAX_DIM = 2**31 - 1  # XLA's dimension sizes are int64, but nothing real is this big


def check_args(args: tuple[Any, ...]) -> None:
    """`args` must be arrays or jax.ShapeDtypeStructs (or pytrees of them, or
    Python numbers) with dimensions in 0..2^31-1: InputError otherwise, instead
    of a failure deep inside JAX."""
    import jax

    if not isinstance(args, (tuple, list)):
        raise InputError(f"args must be a tuple of arrays or jax.ShapeDtypeStructs, not "
                         f"{type(args).__name__}")
    try:
        leaves = jax.tree_util.tree_leaves(tuple(args))
    except Exception as e:  # noqa: BLE001: a hostile container
        raise InputError(f"args cannot be flattened: {type(e).__name__}: {e}") from None
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (bool, int, float, complex)):
            continue
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if dtype is None or not isinstance(shape, tuple):
            raise InputError(f"args: argument {i} is a {type(leaf).__name__}, not an array or "
                             "a jax.ShapeDtypeStruct")
        try:
            numeric = jax.numpy.issubdtype(dtype, jax.numpy.number) or \
                jax.numpy.issubdtype(dtype, jax.numpy.bool_) or \
                jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)   # carried as key data
        except Exception:  # noqa: BLE001: not a dtype at all
            numeric = False
        if not numeric:
            raise InputError(f"args: argument {i} has dtype {dtype}: expected a numeric or "
                             "boolean dtype, or a PRNG key")
        bad = [d for d in shape if not isinstance(d, int) or not 0 <= d <= MAX_DIM]
        if bad:
            raise InputError(f"args: argument {i} has shape {shape}: every dimension must be an "
                             f"integer in 0..{MAX_DIM}")


def _check_devices(problem: Problem) -> None:
    """A one-rank program verifies trivially: when JAX sees a single device, the
    mesh the user asked for was most likely cut down to it."""
    import jax

    if problem.mesh.size <= 1 and jax.device_count() <= 1:
        raise InputError("JAX sees only 1 device, so the distributed program runs on one rank "
                         "and its verification would prove nothing: set XLA_FLAGS="
                         "--xla_force_host_platform_device_count=8 before importing jax")
