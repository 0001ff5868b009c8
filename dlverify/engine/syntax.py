"""The syntax tree of a program in the Soufflé subset (datalog/README.md).

Terms and literals keep the line they were read from so that every later
error (checker, translator, engine) can name the file and line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from dlverify.errors import DialectError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
README = "datalog/README.md"
PRIMITIVE_TYPES = ("number", "symbol")


def refuse(what: str, file: str, line: int) -> DialectError:
    """The error for a construct outside the subset."""
    return DialectError(f"{what} is not in the supported Soufflé subset (see {README})", file, line)



@dataclass(eq=False)
class Var:
    name: str
    line: int


@dataclass(eq=False)
class Wild:
    line: int


@dataclass(eq=False)
class Num:
    value: int
    line: int


@dataclass(eq=False)
class Str:
    value: str
    line: int


@dataclass(eq=False)
class Nil:
    line: int


@dataclass(eq=False)
class Record:
    items: list
    line: int


@dataclass(eq=False)
class BinOp:
    op: str  # + - * / %
    left: object
    right: object
    line: int


@dataclass(eq=False)
class Neg:
    arg: object
    line: int


@dataclass(eq=False)
class Agg:
    kind: str  # count sum min max
    target: object | None
    body: list
    line: int
    locals: list[str] = field(default_factory=list)  # filled by the checker


@dataclass(eq=False)
class Atom:
    rel: str
    args: list
    line: int
    negated: bool = False


@dataclass(eq=False)
class Cmp:
    op: str  # = != < <= > >=
    left: object
    right: object
    line: int


@dataclass
class Plan:
    """One `version:(atom order)` entry of a `.plan` clause (atom indices are 1-based)."""
    version: int
    order: tuple[int, ...]
    line: int


@dataclass(eq=False)
class Clause:
    head: Atom
    body: list  # empty for a fact
    file: str
    line: int
    plans: list[Plan] = field(default_factory=list)  # from a `.plan` after the rule


@dataclass
class TypeDef:
    name: str
    kind: str  # "number" | "symbol" | "record"
    fields: tuple[tuple[str, str], ...]  # record fields (name, type)
    file: str
    line: int


@dataclass
class Decl:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, type)
    file: str
    line: int


@dataclass
class Program:
    main: Path
    types: dict[str, TypeDef] = field(default_factory=dict)
    decls: dict[str, Decl] = field(default_factory=dict)
    inputs: dict[str, tuple[str, int]] = field(default_factory=dict)
    outputs: dict[str, tuple[str, int]] = field(default_factory=dict)
    clauses: list[Clause] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def kind(self, type_name: str) -> str:
        """'number', 'symbol' or 'record' for a type name of this program."""
        if type_name in PRIMITIVE_TYPES:
            return type_name
        return self.types[type_name].kind

    def column_kinds(self, rel: str) -> tuple[str, ...]:
        return tuple(self.kind(t) for _, t in self.decls[rel].columns)

    def column_types(self, rel: str) -> tuple[str, ...]:
        return tuple(t for _, t in self.decls[rel].columns)


# ---------------------------------------------------------------------------- traversals


def subterms(t) -> Iterator:
    """t and its subterms, not descending into aggregates."""
    yield t
    if isinstance(t, Record):
        for x in t.items:
            yield from subterms(x)
    elif isinstance(t, BinOp):
        yield from subterms(t.left)
        yield from subterms(t.right)
    elif isinstance(t, Neg):
        yield from subterms(t.arg)


def lit_terms(lit) -> list:
    return list(lit.args) if isinstance(lit, Atom) else [lit.left, lit.right]


def vars_of_lits(lits) -> Iterator[Var]:
    for lit in lits:
        for t in lit_terms(lit):
            for s in subterms(t):
                if isinstance(s, Var):
                    yield s


def aggs(lits) -> Iterator[Agg]:
    for lit in lits:
        for t in lit_terms(lit):
            for s in subterms(t):
                if isinstance(s, Agg):
                    yield s


def agg_vars(agg: Agg) -> Iterator[Var]:
    if agg.target is not None:
        for s in subterms(agg.target):
            if isinstance(s, Var):
                yield s
    yield from vars_of_lits(agg.body)
