"""Evaluate a checked Program with the embedded clingo (5.8) Python API.

The rules are the translation of `dialect.translate`. Input facts do not go through
clingo's text parser (about 6 s per million facts): each relation is packed into one
term `f((1,2),(3,4),...)` read by `clingo.parse_term`, and a rule
`p(X1,...,Xn) :- (X1,...,Xn) = @dlv_facts(k).` enumerates its arguments while grounding.
"""
from __future__ import annotations

import re
import threading
import time
from operator import itemgetter
from typing import Mapping, Sequence

import clingo
from clingo import SymbolType

from dlverify.engine.syntax import Program
from dlverify.engine.translate import Translation, translate
from dlverify.errors import EngineError
from dlverify.limits import OutOfTime

_CHUNK = 200_000  # rows per parse_term call
_LOC = re.compile(r"<block>:(\d+):(\d+)(?:-(\d+:)?\d+)?")


def _escape(s: str) -> str:
    """The body of a clingo string literal for s (the quotes are in the row format)."""
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _pack(rows: Sequence[tuple], kinds: Sequence[str]) -> list[clingo.Symbol]:
    """The rows as clingo symbols: plain values for arity 1, tuples otherwise."""
    fmt = "(" + ",".join('"%s"' if k == "symbol" else "%d" for k in kinds) + ")"
    for i, k in enumerate(kinds):
        if k == "symbol":
            joined = "".join(map(itemgetter(i), rows))
            if "\\" in joined or '"' in joined:  # rare: escape this column value by value
                rows = [r[:i] + (_escape(r[i]),) + r[i + 1:] for r in rows]
    if len(kinds) == 1:
        fmt = fmt[1:-1]
    out: list[clingo.Symbol] = []
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start:start + _CHUNK]
        text = "f(" + ",".join(map(fmt.__mod__, chunk)) + ")"
        try:
            out.extend(clingo.parse_term(text).arguments)
        except RuntimeError as e:  # pragma: no cover - validated input cannot fail here
            raise EngineError(f"clingo could not read the facts: {e}") from None
    return out


class _Context:
    def __init__(self, tables: list[list[clingo.Symbol]]) -> None:
        self.tables = tables

    def dlv_facts(self, k: clingo.Symbol) -> list[clingo.Symbol]:
        return self.tables[k.number]


def to_python(sym: clingo.Symbol):
    """Number -> int, String -> str, tuple -> tuple, nil -> None, other constant -> str."""
    t = sym.type
    if t is SymbolType.Number:
        return sym.number
    if t is SymbolType.String:
        return sym.string
    if t is SymbolType.Function:
        name = sym.name
        args = sym.arguments
        if name == "":
            return tuple(map(to_python, args))
        if not args:
            return None if name == "nil" else name
        raise EngineError(f"unexpected compound value {sym} in a clingo result")
    raise EngineError(f"unexpected value {sym} in a clingo result")


def _rows_public(symbols: Sequence[clingo.Symbol], by_pred: dict[str, str]) -> dict[str, list[tuple]]:
    """Result rows through the public Symbol API (about 7 us per atom)."""
    result: dict[str, list[tuple]] = {n: [] for n in by_pred.values()}
    for s in symbols:
        name = by_pred.get(s.name)
        if name is not None:
            result[name].append(tuple(map(to_python, s.arguments)))
    return result


_MISSING = object()


class _RawReader:
    """Result rows through clingo's C API (the cffi `_lib` behind the Python API, clingo==5.8.3 is
    pinned): about 3x faster than the public Symbol API, with a cache per symbol (clingo symbols
    are interned, so equal values have equal representations)."""

    def __init__(self) -> None:
        from clingo._internal import _ffi, _lib  # private: ImportError -> public API

        self.lib, self.ffi = _lib, _ffi
        self.p_int = _ffi.new("int*")
        self.p_args = _ffi.new("clingo_symbol_t**")
        self.p_size = _ffi.new("size_t*")
        self.p_str = _ffi.new("char**")
        self.NUM = _lib.clingo_symbol_type_number
        self.STR = _lib.clingo_symbol_type_string
        self.FUN = _lib.clingo_symbol_type_function
        self.cache: dict[int, object] = {}

    def value(self, rep: int):
        lib = self.lib
        t = lib.clingo_symbol_type(rep)
        if t == self.NUM:
            lib.clingo_symbol_number(rep, self.p_int)
            v = self.p_int[0]
        elif t == self.STR:
            lib.clingo_symbol_string(rep, self.p_str)
            v = self.ffi.string(self.p_str[0]).decode()
        elif t == self.FUN:
            lib.clingo_symbol_arguments(rep, self.p_args, self.p_size)
            args = self.p_args[0][0:self.p_size[0]]
            if args:
                lib.clingo_symbol_name(rep, self.p_str)
                if self.p_str[0][0] != b"\0":
                    raise EngineError(f"unexpected compound value {clingo.Symbol(rep)} in a clingo result")
                v = tuple([self.value(a) if (c := self.cache.get(a, _MISSING)) is _MISSING else c
                           for a in args])
            else:
                lib.clingo_symbol_name(rep, self.p_str)
                name = self.ffi.string(self.p_str[0]).decode()
                v = None if name == "nil" else name
        else:
            raise EngineError(f"unexpected value {clingo.Symbol(rep)} in a clingo result")
        self.cache[rep] = v
        return v

    def rows(self, symbols: Sequence[clingo.Symbol], by_pred: dict[str, str]) -> dict[str, list[tuple]]:
        lib, ffi, cache, value = self.lib, self.ffi, self.cache, self.value
        p_args, p_size, p_str = self.p_args, self.p_size, self.p_str
        result: dict[str, list[tuple]] = {n: [] for n in by_pred.values()}
        by_bytes = {p.encode(): result[n] for p, n in by_pred.items()}
        single = next(iter(by_bytes.values())) if len(by_bytes) == 1 else None
        for s in symbols:
            rep = s._rep
            if single is None:
                lib.clingo_symbol_name(rep, p_str)
                out = by_bytes.get(ffi.string(p_str[0]))
                if out is None:
                    continue
            else:
                out = single
            lib.clingo_symbol_arguments(rep, p_args, p_size)
            out.append(tuple([value(a) if (c := cache.get(a, _MISSING)) is _MISSING else c
                              for a in p_args[0][0:p_size[0]]]))
        return result


def collect_rows(symbols: Sequence[clingo.Symbol], by_pred: dict[str, str],
                 fast: bool = True) -> dict[str, list[tuple]]:
    """Rows per relation of the shown atoms; `by_pred` maps clingo predicate -> relation."""
    if fast:
        try:
            reader = _RawReader()
        except (ImportError, AttributeError):
            reader = None
        if reader is not None:
            return reader.rows(symbols, by_pred)
    return _rows_public(symbols, by_pred)


def _map_locations(msg: str, tr: Translation) -> str:
    def repl(m: re.Match) -> str:
        origin = tr.origin(int(m.group(1)))
        return f"{origin[0]}:{origin[1]}" if origin else m.group(0)
    return _LOC.sub(repl, msg)


def program_text(program: Program, outputs: Sequence[str]) -> Translation:
    """The translated rules, with `#show` for `outputs` only."""
    return translate(program, shown=outputs)


def run_clingo(program: Program, facts: Mapping[str, Sequence[tuple]], outputs: Sequence[str],
               translation: Translation | None = None, timeout: float | None = None) -> dict[str, list[tuple]]:
    """Evaluate `program` on validated flat `facts`; return rows of each relation in `outputs`."""
    tr = translation or program_text(program, outputs)
    messages: list[str] = []

    def logger(_code, msg: str) -> None:
        messages.append(msg.rstrip())

    ctl = clingo.Control(["--warn=none"], logger=logger, message_limit=50)
    tables: list[list[clingo.Symbol]] = []
    loaders: list[str] = []
    for name, rows in facts.items():
        if not rows:
            continue
        kinds = program.column_kinds(name)
        tables.append(_pack(rows, kinds))
        xs = ",".join(f"X{i}" for i in range(len(kinds)))
        lhs = xs if len(kinds) == 1 else f"({xs})"
        loaders.append(f"{tr.predicates[name]}({xs}) :- {lhs} = @dlv_facts({len(tables) - 1}).")

    def fail(stage: str) -> EngineError:
        detail = "\n".join(_map_locations(m, tr) for m in messages) or "(no message)"
        return EngineError(f"clingo {stage} failed:\n{detail}")

    try:
        ctl.add("base", [], tr.text)
    except RuntimeError:
        raise fail("parsing the translated program") from None
    if loaders:
        try:
            ctl.add("dlv_facts", [], "\n".join(loaders))
        except RuntimeError:
            raise fail("parsing the fact loaders") from None
    parts = [("base", [])] + ([("dlv_facts", [])] if loaders else [])
    outcome = _Outcome()

    def evaluate() -> None:
        try:
            ctl.ground(parts, context=_Context(tables))
            with ctl.solve(yield_=True) as handle:
                for model in handle:
                    outcome.symbols = model.symbols(shown=True)
                    break
        except RuntimeError:
            outcome.failed = "grounding"
        except BaseException as e:  # pragma: no cover - re-raised in the caller's thread
            outcome.error = e

    _wait(evaluate, timeout)
    if outcome.error is not None:
        raise outcome.error
    if outcome.failed:
        raise fail(outcome.failed)
    if outcome.symbols is None:
        raise EngineError("clingo found no model: the program is not a stratified Datalog program")
    return collect_rows(outcome.symbols, {tr.predicates[n]: n for n in outputs})


class _Outcome:
    """What the evaluation thread left behind."""

    def __init__(self) -> None:
        self.symbols: Sequence[clingo.Symbol] | None = None
        self.failed = ""
        self.error: BaseException | None = None


def _wait(evaluate, timeout: float | None) -> None:
    """Run `evaluate` (grounding and solving) in a thread and wait for it in this one.

    clingo releases the GIL while it grounds, so this thread keeps running Python: the
    SIGALRM time limit of dlverify/limits.py raises OutOfTime here at once instead of after
    grounding. The abandoned grounding cannot be stopped (clingo can interrupt solving only,
    and `Control.interrupt` waits for a grounding callback to return), so it runs on in its
    daemon thread until it ends or the process exits (the CLI runs cases in a child process)."""
    done = threading.Event()

    def work() -> None:
        try:
            evaluate()
        finally:
            done.set()

    # An Event, not Thread.join: a signal interrupting join makes Python 3.11 mark the
    # still-running thread as stopped (bpo-45274's clean-up).
    worker = threading.Thread(target=work, name="clingo-ground", daemon=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    worker.start()
    while not done.wait(0.05):  # SIGALRM's OutOfTime (or ^C) surfaces here and propagates
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime(f"out of time after {timeout:g} s (clingo)")
