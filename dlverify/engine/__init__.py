"""Run Datalog programs written in the Soufflé subset of datalog/README.md.

`run_program` evaluates a main .dl file (and its `#include`s) on flat input facts with
Soufflé (a subprocess, when `souffle` is on PATH) or with the embedded clingo through a
translation of the subset. Both return the same Python values: ints, strs, records as
nested tuples with `nil` as None.
"""
from __future__ import annotations

import functools

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Mapping, Sequence

from dlverify.engine import clingo_runner, souffle_runner
from dlverify.engine.dialect import Program, parse_program
from dlverify.engine.facts_io import sort_rows, validate_rows, write_facts_dir
from dlverify.errors import InputError
from dlverify.schema import Relation

EngineName = Literal["auto", "clingo", "souffle"]

__all__ = ["EngineName", "EngineResult", "run_program", "resolve_engine"]


@dataclass
class EngineResult:
    engine: str                        # "clingo" or "souffle"
    relations: dict[str, list[tuple]]  # output relation name -> rows
    seconds: float                     # wall time of evaluation (translation+grounding+solving, or the souffle run)
    work_dir: Path | None              # where facts/outputs were written (souffle, or when keep_dir given)


def resolve_engine(engine: EngineName) -> str:
    """'auto' -> 'souffle' when `souffle` is on PATH, else 'clingo'."""
    if engine == "auto":
        return "souffle" if shutil.which("souffle") else "clingo"
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


def _stamp(main_dl: Path) -> tuple:
    """Identifies the rule files' current contents (their names and modification times)."""
    return tuple((p.name, p.stat().st_mtime_ns) for p in sorted(main_dl.resolve().parent.rglob("*.dl")))


@functools.lru_cache(maxsize=8)
def _parsed(main_dl: str, stamp: tuple) -> Program:
    """Parsing and checking the rules once per process (segmented runs call the engine often)."""
    return parse_program(Path(main_dl))


def run_program(main_dl: Path, facts: Mapping[Relation, Sequence[tuple]], outputs: Sequence[Relation],
                engine: EngineName = "auto", keep_dir: Path | None = None) -> EngineResult:
    """Evaluate `main_dl` on `facts` and return the rows of `outputs`.

    Raises DialectError for a construct outside the subset, InputError for facts that do not
    fit the program (undeclared or non-.input relation, arity, 32-bit range, tab/newline in a
    symbol) and EngineError when the engine itself fails.
    """
    name = resolve_engine(engine)
    main_dl = Path(main_dl)
    start = time.perf_counter()
    program = _parsed(str(main_dl.resolve()), _stamp(main_dl))
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
        tr = clingo_runner.program_text(program, out_names)
        if work_dir is not None:
            (work_dir / "program.lp").write_text(tr.text, encoding="utf-8")
        relations = clingo_runner.run_clingo(program, flat, out_names, tr)
        seconds = time.perf_counter() - start
    else:
        tmp = None
        if work_dir is None:
            tmp = Path(tempfile.mkdtemp(prefix="dlverify-souffle-"))
            facts_dir, out_dir = tmp / "facts", tmp / "out"
        else:
            facts_dir, out_dir = work_dir, work_dir / "out"
        t0 = time.perf_counter()
        relations = souffle_runner.run_souffle(program, main_dl, flat, out_names, facts_dir, out_dir,
                                               facts_written=work_dir is not None)
        seconds = time.perf_counter() - t0
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return EngineResult(name, {n: sort_rows(rows) for n, rows in relations.items()}, seconds, work_dir)
