"""Fact validation, Soufflé `.facts` writing (headerless TSV) and Soufflé `.csv` output reading.

Input facts are flat: every column is a number (32-bit) or a symbol without tab, newline or
carriage return. Output rows may hold records, which Soufflé prints as `[1, [2, nil]]`; they
are read back as nested tuples with `nil` as None.
"""
from __future__ import annotations

from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from dlverify.errors import EngineError, InputError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
_BAD_SYMBOL_CHARS = ("\t", "\n", "\r")


def validate_rows(rel: str, kinds: Sequence[str], rows: Iterable[Sequence]) -> list[tuple]:
    """Rows of relation `rel` as tuples, checked against the column kinds ('number'/'symbol').

    Raises InputError for a wrong arity, a non-int in a number column (bool and float included),
    an int outside [-2^31, 2^31), a non-str in a symbol column, or a symbol containing a tab,
    newline or carriage return.
    """
    rows = list(rows)
    if set(map(type, rows)) != {tuple}:
        rows = [r if type(r) is tuple else tuple(r) for r in rows]
    n = len(kinds)
    if not rows:
        return rows
    if set(map(len, rows)) != {n}:
        bad = next(r for r in rows if len(r) != n)
        raise InputError(f"relation {rel}: row {bad!r} has {len(bad)} value(s), expected {n}")
    for i, kind in enumerate(kinds):
        get = itemgetter(i)
        if kind == "number":
            if set(map(type, map(get, rows))) != {int}:
                fixed = []
                for v in map(get, rows):
                    if isinstance(v, bool) or not hasattr(v, "__index__"):
                        raise InputError(f"relation {rel}: column {i} expects an integer, got {v!r}")
                    fixed.append(v.__index__())
                rows = [r[:i] + (x,) + r[i + 1:] for r, x in zip(rows, fixed)]
            lo, hi = min(map(get, rows)), max(map(get, rows))
            if lo < INT_MIN or hi > INT_MAX:
                v = lo if lo < INT_MIN else hi
                raise InputError(f"relation {rel}: value {v} in column {i} is outside the 32-bit range "
                                 "[-2^31, 2^31) of the Datalog engines")
        elif kind == "symbol":
            if set(map(type, map(get, rows))) != {str}:
                v = next(v for v in map(get, rows) if type(v) is not str)
                raise InputError(f"relation {rel}: column {i} expects a string, got {v!r}")
            joined = "".join(map(get, rows))
            if any(c in joined for c in _BAD_SYMBOL_CHARS):
                v = next(v for v in map(get, rows) if any(c in v for c in _BAD_SYMBOL_CHARS))
                raise InputError(f"relation {rel}: symbol {v!r} in column {i} contains a tab, "
                                 "newline or carriage return")
        else:
            raise InputError(f"relation {rel}: column {i} has record type; input facts must be flat")
    return rows


def tsv_text(rows: Iterable[tuple]) -> str:
    """Soufflé's default .facts format: one tab-separated line per row, sorted, without duplicates."""
    return "".join("\t".join(map(str, r)) + "\n" for r in sorted(set(rows)))


def write_facts_dir(directory: Path, program_inputs: Sequence[str],
                    facts: Mapping[str, Sequence[tuple]]) -> None:
    """Write `<Name>.facts` for every input relation (empty when no facts are given)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in program_inputs:
        (directory / f"{name}.facts").write_text(tsv_text(facts.get(name, ())), encoding="utf-8")


# ---------------------------------------------------------------------------- reading Soufflé output

TypeResolver = Callable[[str], tuple[str, tuple[str, ...]]]
"""type name -> (kind, record field types); kind is 'number', 'symbol' or 'record'."""


class _ValueParser:
    def __init__(self, text: str, resolve: TypeResolver) -> None:
        self.s = text
        self.i = 0
        self.resolve = resolve

    def fail(self, msg: str) -> EngineError:
        return EngineError(f"cannot parse Soufflé output value {self.s!r} at offset {self.i}: {msg}")

    def value(self, ty: str, in_record: bool):
        kind, fields = self.resolve(ty)
        s = self.s
        if kind == "number":
            j = self.i
            if j < len(s) and s[j] == "-":
                j += 1
            while j < len(s) and s[j].isdigit():
                j += 1
            if j == self.i:
                raise self.fail("expected a number")
            v = int(s[self.i:j])
            self.i = j
            return v
        if kind == "symbol":
            if not in_record:
                v, self.i = s[self.i:], len(s)
                return v
            # Soufflé prints symbols in records unquoted: read up to the next ", " or "]"
            j = self.i
            while j < len(s) and not s.startswith(", ", j) and s[j] != "]":
                j += 1
            v, self.i = s[self.i:j], j
            return v
        if s.startswith("nil", self.i):
            self.i += 3
            return None
        if not s.startswith("[", self.i):
            raise self.fail("expected '[' or nil")
        self.i += 1
        items = []
        for k, fty in enumerate(fields):
            if k:
                if not s.startswith(", ", self.i):
                    raise self.fail("expected ', '")
                self.i += 2
            items.append(self.value(fty, True))
        if not s.startswith("]", self.i):
            raise self.fail("expected ']'")
        self.i += 1
        return tuple(items)


def parse_value(text: str, ty: str, resolve: TypeResolver):
    """One field of a Soufflé output line, converted by its declared type."""
    p = _ValueParser(text, resolve)
    v = p.value(ty, False)
    if p.i != len(text):
        raise p.fail("trailing text")
    return v


def read_csv_text(text: str, types: Sequence[str], resolve: TypeResolver) -> list[tuple]:
    """Rows of a Soufflé output file (tab-separated, no header, strings unquoted)."""
    kinds = [resolve(t)[0] for t in types]
    rows = []
    for line in text.split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != len(types):
            raise EngineError(f"Soufflé output line {line!r} has {len(fields)} field(s), expected {len(types)}")
        row = []
        for f, ty, kind in zip(fields, types, kinds):
            if kind == "number":
                try:
                    row.append(int(f))
                except ValueError:
                    raise EngineError(f"Soufflé output {line!r}: {f!r} is not a number") from None
            elif kind == "symbol":
                row.append(f)
            else:
                row.append(parse_value(f, ty, resolve))
        rows.append(tuple(row))
    return rows


def read_csv(path: Path, types: Sequence[str], resolve: TypeResolver) -> list[tuple]:
    return read_csv_text(path.read_text(encoding="utf-8"), types, resolve)


# ---------------------------------------------------------------------------- result ordering


def sort_key(v):
    """A total order on result values (None < int < str < tuple), for deterministic output."""
    if v is None:
        return (0,)
    if type(v) is int:
        return (1, v)
    if type(v) is str:
        return (2, v)
    return (3, tuple(sort_key(x) for x in v))


def sort_rows(rows: list[tuple]) -> list[tuple]:
    try:
        return sorted(rows)
    except TypeError:  # None inside records
        return sorted(rows, key=sort_key)
