"""Run Datalog programs written in the Soufflé subset of datalog/README.md.

`run_program` evaluates a main .dl file (and its `#include`s) on flat input facts with
Soufflé (a subprocess, when `souffle` is on PATH) or with the embedded clingo through a
translation of the subset. Both return the same Python values: ints, strs, records as
nested tuples with `nil` as None.

The rules are parsed, checked and translated once per rule text (segmented runs call
`run_program` once per window): `_LOADED` keeps them keyed by the files' contents, and
rules_cache.py keeps the installed rules' parse on disk between runs.

Engine choice (`auto`, measured in bench/bench_verify.py, README "Engines"): Soufflé when
its compiled binary for the current rules is already cached (a compiled run starts in
milliseconds and evaluates faster than clingo grounds); clingo otherwise (Soufflé's
interpreter pays ~0.2 s per start and evaluates no faster than clingo on these rules, and
compiling costs minutes once, which no single run wins back).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Sequence

from dlverify.engine import clingo_runner, rules_cache, souffle_runner
from dlverify.engine.dialect import Program, parse_program
from dlverify.engine.facts_io import sort_rows, validate_rows, write_facts_dir
from dlverify.engine.translate import Translation
from dlverify.errors import EngineError, InputError
from dlverify.schema import Relation

EngineName = Literal["auto", "clingo", "souffle"]

__all__ = ["EngineName", "EngineResult", "run_program", "resolve_engine", "load_rules"]


@dataclass
class EngineResult:
    engine: str                        # "clingo" or "souffle"
    relations: dict[str, list[tuple]]  # output relation name -> rows
    seconds: float                     # wall time of evaluation (translation+grounding+solving, or the souffle run)
    work_dir: Path | None              # where facts/outputs were written (souffle, or when keep_dir given)


@dataclass
class LoadedRules:
    """A parsed and checked rule program, with what each engine derived from it once."""
    program: Program
    texts: dict[Path, bytes]                       # every file read, by path: the cache key
    translations: dict[tuple[str, ...], Translation] = field(default_factory=dict)  # by shown outputs
    souffle_plans: dict[str, souffle_runner.SoufflePlan] = field(default_factory=dict)  # by mode


_LOADED: dict[Path, LoadedRules] = {}  # main .dl (resolved) -> its rules; a few entries per process


def load_rules(main_dl: Path) -> LoadedRules:
    """Parse and check `main_dl` once per content of its files (re-read and compared per
    call); the installed rules' parse is also kept between runs (rules_cache.py)."""
    key = Path(main_dl).resolve()
    rules = _LOADED.get(key)
    if rules is not None and rules_cache.same_bytes(rules.texts):
        return rules
    stored = rules_cache.load(key)
    if stored is not None:
        rules = LoadedRules(*stored)
    else:
        program = parse_program(key)
        rules = LoadedRules(program, {p: p.read_bytes() for p in program.files})
        rules_cache.store(key, program, rules.texts)
    if len(_LOADED) >= 8:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = rules
    return rules


def resolve_engine(engine: EngineName, main_dl: Path | None = None) -> str:
    """The engine that will run: 'auto' -> 'souffle' when `souffle` is on PATH and the compiled
    binary of the rules `main_dl` is cached, else 'clingo' (see the module doc)."""
    if engine == "auto":
        exe = shutil.which("souffle")
        if exe is None or main_dl is None:
            return "clingo"
        try:
            if souffle_runner.requested_mode() == "interpreted":
                return "clingo"
            rules = load_rules(main_dl)
            return "souffle" if souffle_runner.cached_binary(rules.program, exe) else "clingo"
        except InputError:
            return "clingo"  # the rules' own errors are reported by the run itself
    if engine == "souffle":
        if not shutil.which("souffle"):
            raise InputError("engine 'souffle' requested but `souffle` is not on PATH")
        return "souffle"
    if engine == "clingo":
        return "clingo"
    raise InputError(f"unknown engine {engine!r} (expected 'auto', 'clingo' or 'souffle')")


def _kind(program: Program, ty: str, rel: str) -> str:
    if ty in ("number", "symbol"):
        return ty
    if ty in program.types:
        td = program.types[ty]
        return f"record {ty}" if td.kind == "record" else td.kind
    raise InputError(f"relation {rel}: column type {ty} is not declared in {program.main}")


def _check_relation(program: Program, rel: Relation, role: str) -> None:
    decl = program.decls.get(rel.name)
    where = str(program.main)
    if decl is None:
        raise InputError(f"relation {rel.name} is not declared in {where} or its includes")
    io = program.inputs if role == "input" else program.outputs
    if rel.name not in io:
        raise InputError(f"relation {rel.name} is not an .{role} of {where}")
    if rel.arity != len(decl.columns):
        raise InputError(f"relation {rel.name} has arity {rel.arity} in Python but {len(decl.columns)} "
                         f"in {decl.file}:{decl.line}")
    for col, (_, dty) in zip(rel.columns, decl.columns):
        if _kind(program, col.type, rel.name) != _kind(program, dty, rel.name):
            raise InputError(f"relation {rel.name}: column {col.name} has type {col.type} in Python "
                             f"but {dty} in {decl.file}:{decl.line}")


def _translation(rules: LoadedRules, outputs: Sequence[str]) -> Translation:
    key = tuple(outputs)
    tr = rules.translations.get(key)
    if tr is None:
        tr = rules.translations[key] = clingo_runner.program_text(rules.program, outputs)
    return tr


def run_program(main_dl: Path, facts: Mapping[Relation, Sequence[tuple]], outputs: Sequence[Relation],
                engine: EngineName = "auto", keep_dir: Path | None = None,
                timeout: float | None = None) -> EngineResult:
    """Evaluate `main_dl` on `facts` and return the rows of `outputs`.

    Raises DialectError for a construct outside the subset, InputError for facts that do not
    fit the program (undeclared or non-.input relation, arity, 32-bit range, tab/newline in a
    symbol), EngineError when the engine itself fails, and OutOfTime past `timeout` seconds
    (or when the caller's SIGALRM time limit fires: the engine never swallows it).
    """
    main_dl = Path(main_dl)
    name = resolve_engine(engine, main_dl)
    if engine == "auto" and name == "souffle":
        try:
            return _run(main_dl, facts, outputs, "souffle", keep_dir, timeout)
        except EngineError:
            # auto never breaks a run: a cached binary that no longer starts (a runtime library
            # removed, say) leaves clingo, which evaluates the same rules
            pass
        name = "clingo"
    return _run(main_dl, facts, outputs, name, keep_dir, timeout)


def _run(main_dl: Path, facts: Mapping[Relation, Sequence[tuple]], outputs: Sequence[Relation],
         name: str, keep_dir: Path | None, timeout: float | None) -> EngineResult:
    start = time.perf_counter()
    rules = load_rules(main_dl)
    program = rules.program
    flat: dict[str, list[tuple]] = {}
    for rel, rows in facts.items():
        _check_relation(program, rel, "input")
        flat[rel.name] = validate_rows(rel.name, program.column_kinds(rel.name), rows)
    out_names: list[str] = []
    for rel in outputs:
        _check_relation(program, rel, "output")
        if rel.name not in out_names:
            out_names.append(rel.name)
    work_dir = Path(keep_dir) if keep_dir is not None else None
    if work_dir is not None:
        write_facts_dir(work_dir, list(program.inputs), flat)

    if name == "clingo":
        tr = _translation(rules, out_names)
        if work_dir is not None:
            (work_dir / "program.lp").write_text(tr.text, encoding="utf-8")
        relations = clingo_runner.run_clingo(program, flat, out_names, tr, timeout=timeout)
        seconds = time.perf_counter() - start
    else:
        mode = souffle_runner.requested_mode()
        plan = rules.souffle_plans.get(mode)
        if plan is None:
            plan = rules.souffle_plans[mode] = souffle_runner.plan_run(program, main_dl, mode, timeout=timeout)
        tmp = None
        try:
            if work_dir is None:
                tmp = Path(tempfile.mkdtemp(prefix="dlverify-souffle-"))
                facts_dir, out_dir = tmp / "facts", tmp / "out"
            else:
                facts_dir, out_dir = work_dir, work_dir / "out"
            t0 = time.perf_counter()
            relations = souffle_runner.run_souffle(program, main_dl, flat, out_names, facts_dir, out_dir,
                                                   timeout=timeout, facts_written=work_dir is not None,
                                                   plan=plan)
            seconds = time.perf_counter() - t0
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    return EngineResult(name, {n: sort_rows(rows) for n, rows in relations.items()}, seconds, work_dir)
