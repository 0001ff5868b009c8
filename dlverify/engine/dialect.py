"""Parser and checker of the Soufflé subset (datalog/README.md) and its translation to clingo.

`parse_program(main)` reads a main .dl file and the files it `#include`s, checks
that every construct is in the subset and that the program is well formed
(declared relations, arities, grounded variables, stratified negation), and
returns a `Program`. `translate(program, shown)` turns it into clingo text.
Anything outside the subset raises `DialectError(message, file, line)`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from dlverify.errors import DialectError

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
README = "datalog/README.md"


def _refuse(what: str, file: str, line: int) -> DialectError:
    return DialectError(f"{what} is not in the supported Soufflé subset (see {README})", file, line)


# ============================================================================ AST


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


@dataclass(eq=False)
class Clause:
    head: Atom
    body: list  # empty for a fact
    file: str
    line: int


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
        if type_name in ("number", "symbol"):
            return type_name
        return self.types[type_name].kind

    def column_kinds(self, rel: str) -> tuple[str, ...]:
        return tuple(self.kind(t) for _, t in self.decls[rel].columns)

    def column_types(self, rel: str) -> tuple[str, ...]:
        return tuple(t for _, t in self.decls[rel].columns)


# ============================================================================ lexer

DIRECTIVES = {"decl", "type", "input", "output", "plan", "comp", "init", "functor", "pragma",
              "override", "printsize", "limitsize", "number_type", "symbol_type", "lattice"}
_PUNCT2 = (":-", "<:", "<=", ">=", "!=")
_PUNCT1 = "()[]{},.:=<>!+-*/%;^|&$@~?"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INT = re.compile(r"[0-9]+")
_WS = re.compile(r"[ \t\r\f\v]+")


@dataclass
class Tok:
    kind: str  # id int str p dir hash eof
    value: object
    line: int


def _lex(text: str, file: str) -> list[Tok]:
    toks: list[Tok] = []
    i, n, line = 0, len(text), 1
    line_start = True  # only whitespace seen since the last newline
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            line_start = True
            continue
        m = _WS.match(text, i)
        if m:
            i = m.end()
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise DialectError("unterminated /* comment", file, line)
            line += text.count("\n", i, j)
            i = j + 2
            continue
        if c == "#":
            if not line_start:
                raise DialectError("'#' directive must start a line", file, line)
            j = text.find("\n", i)
            j = n if j < 0 else j
            toks.append(Tok("hash", text[i:j].strip(), line))
            i = j
            continue
        line_start = False
        if c == '"':
            j = i + 1
            while j < n and text[j] not in '"\n':
                if text[j] == "\\":
                    raise _refuse("a backslash escape in a string literal", file, line)
                if text[j] == "\t":
                    raise _refuse("a tab character in a string literal", file, line)
                j += 1
            if j >= n or text[j] != '"':
                raise DialectError("unterminated string literal", file, line)
            toks.append(Tok("str", text[i + 1:j], line))
            i = j + 1
            continue
        m = _INT.match(text, i)
        if m:
            j = m.end()
            if j + 1 < n and text[j] == "." and text[j + 1].isdigit():
                raise _refuse("a floating-point literal", file, line)
            if j < n and (text[j].isalnum() or text[j] == "_"):
                raise _refuse(f"the number literal '{text[i:j + 1]}...' (only decimal integers)", file, line)
            toks.append(Tok("int", int(text[i:j]), line))
            i = j
            continue
        m = _IDENT.match(text, i)
        if m:
            j = m.end()
            if j < n and text[j] == "?":
                raise _refuse("'?' in an identifier", file, line)
            toks.append(Tok("id", m.group(), line))
            i = j
            continue
        if c == "." and i + 1 < n:
            m = _IDENT.match(text, i + 1)
            if m and m.group() in DIRECTIVES:
                toks.append(Tok("dir", m.group(), line))
                i = m.end()
                continue
        two = text[i:i + 2]
        if two in _PUNCT2:
            toks.append(Tok("p", two, line))
            i += 2
            continue
        if c in _PUNCT1:
            toks.append(Tok("p", c, line))
            i += 1
            continue
        raise DialectError(f"unexpected character {c!r}", file, line)
    toks.append(Tok("eof", None, line))
    return toks


# ============================================================================ parser

AGGREGATES = {"count", "sum", "min", "max"}
OTHER_AGGREGATES = {"mean"}
FUNCTORS = {"cat", "strlen", "ord", "substr", "contains", "match", "to_number", "to_string", "to_float",
            "to_unsigned", "min", "max", "autoinc", "range", "lsb", "msb", "abs"}
WORD_OPERATORS = {"band", "bor", "bxor", "bshl", "bshr", "bshru", "bnot", "land", "lor", "lxor", "lnot"}
QUALIFIERS = {"btree", "brie", "eqrel", "inline", "no_inline", "magic", "no_magic", "override",
              "choice", "btree_delete", "deltas"}
CMP_OPS = {"=", "!=", "<", "<=", ">", ">="}
_REFUSED_DIRECTIVES = {
    "comp": "`.comp` (components)", "init": "`.init` (component instances)",
    "functor": "`.functor` (user-defined functors)", "pragma": "`.pragma`",
    "override": "`.override`", "printsize": "`.printsize`", "limitsize": "`.limitsize`",
    "number_type": "`.number_type`", "symbol_type": "`.symbol_type`", "lattice": "`.lattice`",
}
_INCLUDE = re.compile(r'#\s*include\s+"([^"]+)"\s*(//.*)?$')
_PRAGMA_ONCE = re.compile(r"#\s*pragma\s+once\s*(//.*)?$")


class _Loader:
    """Reads the main file and its includes into one Program (file order, includes inline)."""

    def __init__(self, main: Path) -> None:
        self.program = Program(main=main)
        self.tokens: dict[Path, list[Tok]] = {}
        self.has_pragma_once: dict[Path, bool] = {}
        self.seen: set[Path] = set()

    def lex(self, path: Path) -> list[Tok]:
        if path not in self.tokens:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                raise DialectError(f"cannot read {path}: {e.strerror}", str(path), 0) from None
            toks = _lex(text, str(path))
            self.tokens[path] = toks
            self.has_pragma_once[path] = any(t.kind == "hash" and _PRAGMA_ONCE.match(t.value) for t in toks)
        return self.tokens[path]

    def load(self, path: Path, from_file: str = "", from_line: int = 0) -> None:
        path = path.resolve()
        if path in self.seen:
            self.lex(path)
            if not self.has_pragma_once[path]:
                raise DialectError(f"{path.name} is included a second time but has no `#pragma once` "
                                   "(Soufflé's preprocessor would duplicate its declarations)",
                                   from_file, from_line)
            return
        if from_file and not path.is_file():
            raise DialectError(f"included file not found: {path}", from_file, from_line)
        self.seen.add(path)
        self.program.files.append(path)
        _Parser(self, path, self.lex(path)).parse_file()


class _Parser:
    def __init__(self, loader: _Loader, path: Path, toks: list[Tok]) -> None:
        self.loader = loader
        self.prog = loader.program
        self.path = path
        self.file = str(path)
        self.toks = toks
        self.i = 0
        self.after_rule = False  # the previous statement was a rule (a `.plan` may follow)

    # ------------------------------------------------------------ token helpers
    def peek(self, k: int = 0) -> Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> Tok:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def at(self, value: str, k: int = 0) -> bool:
        t = self.peek(k)
        return t.kind == "p" and t.value == value

    def err(self, msg: str, tok: Tok | None = None) -> DialectError:
        return DialectError(msg, self.file, (tok or self.peek()).line)

    def refuse(self, what: str, tok: Tok | None = None) -> DialectError:
        return _refuse(what, self.file, (tok or self.peek()).line)

    @staticmethod
    def show(t: Tok) -> str:
        if t.kind == "eof":
            return "end of file"
        if t.kind == "str":
            return f'"{t.value}"'
        if t.kind == "dir":
            return f"'.{t.value}'"
        return f"'{t.value}'"

    def expect(self, value: str) -> Tok:
        t = self.peek()
        if t.kind == "p" and t.value == value:
            return self.next()
        raise self.err(f"expected '{value}' but found {self.show(t)}", t)

    def ident(self, what: str) -> Tok:
        t = self.peek()
        if t.kind != "id":
            raise self.err(f"expected {what} but found {self.show(t)}", t)
        return self.next()

    # ------------------------------------------------------------ statements
    def parse_file(self) -> None:
        while self.peek().kind != "eof":
            t = self.peek()
            if t.kind == "hash":
                self.next()
                self.hash_directive(t)
                self.after_rule = False
            elif t.kind == "dir":
                self.directive()
            elif t.kind == "id":
                self.clause()
            else:
                raise self.err(f"unexpected {self.show(t)} at the start of a statement", t)

    def hash_directive(self, t: Tok) -> None:
        text = t.value
        if _PRAGMA_ONCE.match(text):
            return
        m = _INCLUDE.match(text)
        if m:
            self.loader.load(self.path.parent / m.group(1), self.file, t.line)
            return
        word = re.match(r"#\s*(\w*)", text).group(1)
        if word == "include":
            raise self.refuse('an #include other than `#include "file.dl"`', t)
        raise self.refuse(f"the preprocessor directive `#{word}`", t)

    def directive(self) -> None:
        t = self.next()
        d = t.value
        if d == "plan":
            if not self.after_rule:
                raise self.err("`.plan` must follow a rule", t)
            self.plan()
            self.after_rule = False
            return
        self.after_rule = False
        if d in _REFUSED_DIRECTIVES:
            raise self.refuse(_REFUSED_DIRECTIVES[d], t)
        if d == "decl":
            self.decl(t)
        elif d == "type":
            self.type_decl(t)
        elif d in ("input", "output"):
            name = self.ident(f"a relation name after .{d}")
            if self.at("("):
                raise self.refuse(f"I/O parameters on .{d}")
            if self.at(","):
                raise self.refuse(f"several relations in one .{d}")
            if self.at("."):
                raise self.refuse("a qualified (component) relation name")
            target = self.prog.inputs if d == "input" else self.prog.outputs
            target.setdefault(name.value, (self.file, t.line))

    def plan(self) -> None:
        while True:
            if self.peek().kind != "int":
                raise self.err(f"expected a version number in .plan but found {self.show(self.peek())}")
            self.next()
            self.expect(":")
            self.expect("(")
            if not self.at(")"):
                while True:
                    if self.peek().kind != "int":
                        raise self.err(f"expected an atom index in .plan but found {self.show(self.peek())}")
                    self.next()
                    if not self.at(","):
                        break
                    self.next()
            self.expect(")")
            if not self.at(","):
                return
            self.next()

    def decl(self, t: Tok) -> None:
        name = self.ident("a relation name after .decl")
        if self.at(","):
            raise self.refuse("several relations in one .decl")
        if self.at("."):
            raise self.refuse("a qualified (component) relation name")
        self.expect("(")
        cols: list[tuple[str, str]] = []
        if not self.at(")"):
            while True:
                col = self.ident("a column name")
                self.expect(":")
                ty = self.ident("a column type")
                if self.at("."):
                    raise self.refuse("a qualified (component) type name")
                cols.append((col.value, ty.value))
                if not self.at(","):
                    break
                self.next()
        self.expect(")")
        q = self.peek()
        if q.kind == "id" and q.value in QUALIFIERS and not self.at("(", 1):
            what = "choice-domain" if q.value == "choice" else q.value
            raise self.refuse(f"the relation qualifier `{what}`", q)
        if name.value in self.prog.decls:
            prev = self.prog.decls[name.value]
            raise DialectError(f"relation {name.value} declared twice (first at {prev.file}:{prev.line})",
                               self.file, name.line)
        if not cols:
            raise self.refuse(f"the nullary relation {name.value}", name)
        self.prog.decls[name.value] = Decl(name.value, tuple(cols), self.file, name.line)

    def type_decl(self, t: Tok) -> None:
        name = self.ident("a type name after .type")
        if name.value in self.prog.types or name.value in ("number", "symbol"):
            raise DialectError(f"type {name.value} declared twice", self.file, name.line)
        if self.at("<:"):
            self.next()
            base = self.ident("a base type after '<:'")
            if base.value not in ("number", "symbol"):
                if base.value in ("float", "unsigned"):
                    raise self.refuse(f"the type {base.value}", base)
                raise self.refuse(f"a subtype of {base.value} (only `<: number` and `<: symbol`)", base)
            self.prog.types[name.value] = TypeDef(name.value, base.value, (), self.file, name.line)
            return
        if self.at("="):
            self.next()
            if not self.at("["):
                raise self.refuse("a type other than `<: number`, `<: symbol` or a record `= [...]` "
                                  "(equivalence, union or ADT types)")
            self.next()
            fields: list[tuple[str, str]] = []
            if self.at("]"):
                raise self.refuse("the empty record type")
            while True:
                f = self.ident("a record field name")
                self.expect(":")
                ty = self.ident("a record field type")
                fields.append((f.value, ty.value))
                if not self.at(","):
                    break
                self.next()
            self.expect("]")
            if self.at("|"):
                raise self.refuse("a union type")
            self.prog.types[name.value] = TypeDef(name.value, "record", tuple(fields), self.file, name.line)
            return
        raise self.err(f"expected '<:' or '=' after .type {name.value}")

    def clause(self) -> None:
        start = self.peek()
        if self.at(".", 1):
            raise self.refuse("a qualified (component) relation name", start)
        if not self.at("(", 1):
            raise self.err(f"expected a fact or rule but found {self.show(start)}", start)
        head = self.atom(negated=False)
        t = self.peek()
        body: list = []
        if self.at("."):
            self.next()
        elif self.at(":-"):
            self.next()
            body = self.literals(end=".")
            self.expect(".")
        elif self.at(","):
            raise self.refuse("a rule with several head atoms", t)
        elif self.at("<="):
            raise self.refuse("a subsumptive rule (`<=`)", t)
        else:
            raise self.err(f"expected '.' or ':-' after the head atom but found {self.show(t)}", t)
        self.prog.clauses.append(Clause(head, body, self.file, start.line))
        self.after_rule = bool(body)

    # ------------------------------------------------------------ bodies
    def literals(self, end: str) -> list:
        lits = [self.literal()]
        while True:
            t = self.peek()
            if self.at(","):
                self.next()
                lits.append(self.literal())
            elif self.at(";"):
                raise self.refuse("disjunction `;` in a body", t)
            elif self.at(end):
                return lits
            else:
                raise self.err(f"expected ',' or '{end}' but found {self.show(t)}", t)

    def literal(self):
        t = self.peek()
        if self.at("!"):
            n = self.peek(1)
            if n.kind == "id" and self.at("(", 2):
                self.next()
                return self.atom(negated=True)
            if n.kind == "p" and n.value == "(":
                raise self.refuse("a negated group `!(...)`", t)
            raise self.err(f"expected an atom after '!' but found {self.show(n)}", n)
        if self.at("("):
            n, n2 = self.peek(1), self.peek(2)
            if (n.kind == "p" and n.value in ("!", "(")) or (
                    n.kind == "id" and n2.kind == "p" and n2.value == "("
                    and n.value not in FUNCTORS | AGGREGATES):
                raise self.refuse("a parenthesised body group (disjunction)", t)
        if t.kind == "id":
            if t.value in ("true", "false") and not self.at("(", 1):
                raise self.refuse(f"the literal `{t.value}`", t)
            if self.at("(", 1) and t.value not in FUNCTORS:
                return self.atom(negated=False)
        left = self.term()
        op = self.peek()
        if not (op.kind == "p" and op.value in CMP_OPS):
            raise self.err(f"expected a comparison operator but found {self.show(op)}", op)
        self.next()
        right = self.term()
        return Cmp(op.value, left, right, t.line)

    def atom(self, negated: bool) -> Atom:
        name = self.next()
        self.expect("(")
        args: list = []
        if not self.at(")"):
            while True:
                args.append(self.term())
                if not self.at(","):
                    break
                self.next()
        t = self.peek()
        if not self.at(")"):
            raise self.err(f"expected ',' or ')' in the arguments of {name.value} but found {self.show(t)}", t)
        self.next()
        return Atom(name.value, args, name.line, negated)

    # ------------------------------------------------------------ terms
    def check_no_operator(self) -> None:
        t = self.peek()
        if t.kind == "p" and t.value in ("^", "|", "&", "~"):
            raise self.refuse(f"the operator `{t.value}`", t)
        if t.kind == "id" and t.value in WORD_OPERATORS:
            raise self.refuse(f"the operator `{t.value}`", t)
        if t.kind == "id" and t.value == "as":
            raise self.refuse("an `as` type cast", t)

    def term(self):
        left = self.product()
        while True:
            self.check_no_operator()
            t = self.peek()
            if t.kind == "p" and t.value in ("+", "-"):
                self.next()
                left = BinOp(t.value, left, self.product(), t.line)
            else:
                return left

    def product(self):
        left = self.unary()
        while True:
            self.check_no_operator()
            t = self.peek()
            if t.kind == "p" and t.value in ("*", "/", "%"):
                self.next()
                left = BinOp(t.value, left, self.unary(), t.line)
            else:
                return left

    def unary(self):
        t = self.peek()
        if self.at("-"):
            self.next()
            n = self.peek()
            if n.kind == "int":
                self.next()
                return Num(-n.value, n.line)
            return Neg(self.unary(), t.line)
        if t.kind == "id" and t.value in ("bnot", "lnot"):
            raise self.refuse(f"the operator `{t.value}`", t)
        return self.primary()

    def primary(self):
        t = self.peek()
        if t.kind == "int":
            self.next()
            return Num(t.value, t.line)
        if t.kind == "str":
            self.next()
            return Str(t.value, t.line)
        if t.kind == "id":
            v = t.value
            if v == "_":
                self.next()
                return Wild(t.line)
            if v == "nil":
                self.next()
                return Nil(t.line)
            if v in AGGREGATES:
                return self.aggregate()
            if v in OTHER_AGGREGATES:
                raise self.refuse(f"the aggregate `{v}`", t)
            if v in WORD_OPERATORS or v == "as":
                raise self.refuse(f"the operator `{v}`", t)
            if self.at("(", 1):
                raise self.refuse(f"the functor `{v}(...)` (or an atom used as a term)", t)
            self.next()
            return Var(v, t.line)
        if t.kind == "p":
            if t.value == "[":
                self.next()
                if self.at("]"):
                    raise self.refuse("the empty record `[]`", t)
                items = [self.term()]
                while self.at(","):
                    self.next()
                    items.append(self.term())
                self.expect("]")
                return Record(items, t.line)
            if t.value == "(":
                self.next()
                inner = self.term()
                self.expect(")")
                return inner
            if t.value == "$":
                raise self.refuse("an ADT constructor or `$`", t)
            if t.value == "@":
                raise self.refuse("a user-defined functor `@`", t)
        raise self.err(f"expected a term but found {self.show(t)}", t)

    def aggregate(self) -> Agg:
        t = self.next()
        kind = t.value
        target = None
        if kind != "count":
            if self.at("("):
                # `min(a, b)` is a functor; `min (e) : {...}` an aggregate
                save = self.i
                try:
                    self.next()
                    target = self.term()
                    self.expect(")")
                    ok = self.at(":")
                except DialectError:
                    ok = False
                if not ok:
                    self.i = save
                    raise self.refuse(f"the functor `{kind}(...)`", t)
                self.i = save
            target = self.term()
        if not self.at(":"):
            raise self.err(f"expected ':' after `{kind}` in an aggregate but found {self.show(self.peek())}")
        self.next()
        if self.at("{"):
            self.next()
            body = self.literals(end="}")
            self.expect("}")
        elif self.peek().kind == "id" and self.at("(", 1):
            body = [self.atom(negated=False)]
        elif self.at("!") and self.peek(1).kind == "id" and self.at("(", 2):
            self.next()
            body = [self.atom(negated=True)]
        else:
            raise self.err(f"expected '{{' or an atom after '{kind} :' but found {self.show(self.peek())}")
        return Agg(kind, target, body, t.line)


# ============================================================================ checker


def _subterms(t) -> Iterator:
    """t and its subterms, not descending into aggregates."""
    yield t
    if isinstance(t, Record):
        for x in t.items:
            yield from _subterms(x)
    elif isinstance(t, BinOp):
        yield from _subterms(t.left)
        yield from _subterms(t.right)
    elif isinstance(t, Neg):
        yield from _subterms(t.arg)


def _lit_terms(lit) -> list:
    return list(lit.args) if isinstance(lit, Atom) else [lit.left, lit.right]


def _vars_of_lits(lits) -> Iterator[Var]:
    for lit in lits:
        for t in _lit_terms(lit):
            for s in _subterms(t):
                if isinstance(s, Var):
                    yield s


def _aggs(lits) -> Iterator[Agg]:
    for lit in lits:
        for t in _lit_terms(lit):
            for s in _subterms(t):
                if isinstance(s, Agg):
                    yield s


def _agg_vars(agg: Agg) -> Iterator[Var]:
    if agg.target is not None:
        for s in _subterms(agg.target):
            if isinstance(s, Var):
                yield s
    yield from _vars_of_lits(agg.body)


def _grounded_vars(lits, pre: set[str], aggregates_ground: bool = True) -> set[str]:
    """Soufflé's groundedness: positive atom arguments are grounded; a grounded record grounds its
    elements and a record whose elements are grounded is grounded; arithmetic is grounded when its
    operands are (never the reverse); `a = b` grounds either side from the other; an aggregate's
    result is grounded."""
    g = set(pre)

    def mark(t) -> None:
        if isinstance(t, Var):
            g.add(t.name)
        elif isinstance(t, Record):
            for x in t.items:
                mark(x)

    def grounded(t) -> bool:
        if isinstance(t, Var):
            return t.name in g
        if isinstance(t, Wild):
            return False
        if isinstance(t, Record):
            return all(grounded(x) for x in t.items)
        if isinstance(t, BinOp):
            return grounded(t.left) and grounded(t.right)
        if isinstance(t, Neg):
            return grounded(t.arg)
        if isinstance(t, Agg):
            return aggregates_ground
        return True  # constants, nil

    for lit in lits:
        if isinstance(lit, Atom) and not lit.negated:
            for a in lit.args:
                mark(a)
    eqs = [lit for lit in lits if isinstance(lit, Cmp) and lit.op == "="]
    changed = True
    while changed:
        before = len(g)
        for c in eqs:
            if grounded(c.left):
                mark(c.right)
            if grounded(c.right):
                mark(c.left)
        changed = len(g) != before
    return g


class _Checker:
    def __init__(self, prog: Program) -> None:
        self.prog = prog

    def run(self) -> None:
        p = self.prog
        for td in p.types.values():
            for fname, fty in td.fields:
                self.known_type(fty, td.file, td.line)
        for d in p.decls.values():
            for _, ty in d.columns:
                self.known_type(ty, d.file, d.line)
        for kind, io in (("input", p.inputs), ("output", p.outputs)):
            for name, (file, line) in io.items():
                if name not in p.decls:
                    raise DialectError(f".{kind} of undeclared relation {name}", file, line)
        predicate_names(p)  # collisions
        for c in p.clauses:
            self.clause(c)
        self.stratify()

    def known_type(self, ty: str, file: str, line: int) -> None:
        if ty in ("number", "symbol") or ty in self.prog.types:
            return
        if ty in ("float", "unsigned"):
            raise _refuse(f"the type {ty}", file, line)
        raise DialectError(f"unknown type {ty}", file, line)

    # ------------------------------------------------------------ clauses
    def atom(self, a: Atom, file: str) -> None:
        d = self.prog.decls.get(a.rel)
        if d is None:
            raise DialectError(f"relation {a.rel} is not declared", file, a.line)
        if len(a.args) != len(d.columns):
            raise DialectError(f"{a.rel} has arity {len(d.columns)} but is used with {len(a.args)} "
                               "argument(s)", file, a.line)
        for arg, (_, ty) in zip(a.args, d.columns):
            self.const_type(arg, ty, a, file)

    def const_type(self, t, ty: str, a: Atom, file: str) -> None:
        """Type-check the constants of an atom argument against its declared column type."""
        kind = self.prog.kind(ty)
        bad = None
        if isinstance(t, (Num, Neg, BinOp)) and kind != "number":
            bad = "a number"
        elif isinstance(t, Str) and kind != "symbol":
            bad = "a string"
        elif isinstance(t, Nil) and kind != "record":
            bad = "nil"
        elif isinstance(t, Record):
            if kind != "record":
                bad = "a record"
            else:
                fields = self.prog.types[ty].fields
                if len(fields) != len(t.items):
                    raise DialectError(f"record of {len(t.items)} element(s) where {ty} has {len(fields)} "
                                       f"field(s) (in {a.rel})", file, t.line)
                for x, (_, fty) in zip(t.items, fields):
                    self.const_type(x, fty, a, file)
        if bad:
            raise DialectError(f"{bad} where {a.rel} expects type {ty}", file, t.line)

    def term(self, t, file: str, in_atom: bool, in_agg: Agg | None) -> None:
        """Placement rules for wildcards, aggregates and integer range."""
        if isinstance(t, Num):
            if not INT_MIN <= t.value <= INT_MAX:
                raise DialectError(f"integer literal {t.value} is outside the 32-bit range "
                                   "[-2^31, 2^31)", file, t.line)
        elif isinstance(t, Wild):
            if not in_atom:
                raise DialectError("`_` is only allowed as an atom argument", file, t.line)
        elif isinstance(t, Agg):
            raise _refuse("an aggregate other than as `x = <aggregate>`", file, t.line)
        elif isinstance(t, Record):
            for x in t.items:
                self.term(x, file, in_atom, in_agg)
        elif isinstance(t, BinOp):
            self.term(t.left, file, False, in_agg)
            self.term(t.right, file, False, in_agg)
        elif isinstance(t, Neg):
            self.term(t.arg, file, False, in_agg)

    def literals(self, lits, file: str, in_agg: Agg | None) -> None:
        for lit in lits:
            if isinstance(lit, Atom):
                self.atom(lit, file)
                for x in lit.args:
                    self.term(x, file, True, in_agg)
                if in_agg is not None:
                    wild = any(isinstance(s, Wild) for x in lit.args for s in _subterms(x))
                    if wild and lit.negated:
                        raise _refuse("`_` in a negated atom inside an aggregate", file, lit.line)
                    if wild and in_agg.kind == "sum":
                        raise _refuse("`_` inside a sum aggregate (Soufflé sums over tuples or over "
                                      "variable bindings depending on its materialisation: name the "
                                      "variable)", file, lit.line)
            else:
                agg_side = [s for s in (lit.left, lit.right) if isinstance(s, Agg)]
                if agg_side:
                    if in_agg is not None:
                        raise _refuse("a nested aggregate", file, lit.line)
                    other = lit.right if isinstance(lit.left, Agg) else lit.left
                    if lit.op != "=" or len(agg_side) != 1 or not isinstance(other, Var):
                        raise _refuse("an aggregate other than as `x = <aggregate>`", file, lit.line)
                    agg = agg_side[0]
                    if agg.target is not None:
                        self.term(agg.target, file, False, agg)
                    self.literals(agg.body, file, agg)
                else:
                    self.term(lit.left, file, False, in_agg)
                    self.term(lit.right, file, False, in_agg)

    def clause(self, c: Clause) -> None:
        f = c.file
        self.atom(c.head, f)
        for x in c.head.args:
            for s in _subterms(x):
                if isinstance(s, Wild):
                    raise DialectError("`_` in a head atom", f, s.line)
                if isinstance(s, Agg):
                    raise _refuse("an aggregate in a head atom", f, s.line)
            self.term(x, f, False, None)
        if not c.body:
            for x in c.head.args:
                for s in _subterms(x):
                    if isinstance(s, Var):
                        raise DialectError(f"variable {s.name} in a fact", f, s.line)
            return
        self.literals(c.body, f, None)
        self.grounding(c)
        self.types(c)

    def grounding(self, c: Clause) -> None:
        f = c.file
        aggs = list(_aggs(c.body))
        outer_vars = list(_vars_of_lits([c.head])) + list(_vars_of_lits(c.body))
        outer_names = {v.name for v in outer_vars}
        g = _grounded_vars(c.body, set())
        for v in outer_vars:
            if v.name not in g:
                raise DialectError(f"variable {v.name} is not grounded (it must occur in a positive body "
                                   "atom, or be bound with `=` to a grounded term; aggregate witnesses "
                                   "are not in the subset)", f, v.line)
        g0 = _grounded_vars(c.body, set(), aggregates_ground=False)
        seen_in: dict[str, Agg] = {}
        for agg in aggs:
            result = None
            for lit in c.body:
                if isinstance(lit, Cmp) and agg in (lit.left, lit.right):
                    result = lit.right if lit.left is agg else lit.left
            names = {v.name for v in _agg_vars(agg)}
            if result is not None and result.name in names and result.name not in g0:
                raise DialectError(f"the result variable {result.name} of the aggregate occurs inside it "
                                   "but is not grounded elsewhere", f, agg.line)
            for v in _agg_vars(agg):
                if v.name in outer_names and v.name not in g0:
                    raise DialectError(f"variable {v.name} used inside an aggregate must be grounded "
                                       "outside aggregates", f, v.line)
            for n in names - outer_names:
                if n in seen_in and seen_in[n] is not agg:
                    raise _refuse(f"variable {n} shared by two aggregates but used nowhere else", f, agg.line)
                seen_in[n] = agg
            injected = names & outer_names
            gi = _grounded_vars(agg.body, injected)
            for v in _agg_vars(agg):
                if v.name not in gi:
                    raise DialectError(f"variable {v.name} is not grounded inside the aggregate", f, v.line)
            agg.locals = sorted(names - outer_names)

    # ------------------------------------------------------------ types
    def base(self, ty: str) -> str:
        """number / symbol for primitive and subtypes; the record type itself for records."""
        k = self.prog.kind(ty)
        return ty if k == "record" else k

    def meet(self, a: str, b: str) -> str | None:
        if a == b:
            return a
        if self.base(a) != self.base(b):
            return None
        if a in ("number", "symbol"):
            return b
        if b in ("number", "symbol"):
            return a
        return None  # two different subtypes

    def types(self, c: Clause) -> None:
        """An approximation of Soufflé's type checker: every variable gets the meet of the column
        types of the positive body atoms it occurs in (subtypes of one base type are distinct);
        `=`/`!=`/`<`... between variables unify; arithmetic and aggregates are numbers; head and
        negated atom arguments must agree with their column types as Soufflé requires."""
        f = c.file
        parent: dict[str, str] = {}

        def find(v: str) -> str:
            while parent.get(v, v) != v:
                v = parent[v]
            return v

        cons: dict[str, list[tuple[str, int]]] = {}

        def add(v: Var, ty: str) -> None:
            cons.setdefault(v.name, []).append((ty, v.line))

        def constrain(t, ty: str) -> None:
            if isinstance(t, Var):
                add(t, ty)
            elif isinstance(t, Record) and self.prog.kind(ty) == "record":
                fields = self.prog.types[ty].fields
                for x, (_, fty) in zip(t.items, fields):
                    constrain(x, fty)

        def numeric(t) -> None:
            for s in _subterms(t):
                if isinstance(s, (BinOp, Neg)):
                    for x in (s.left, s.right) if isinstance(s, BinOp) else (s.arg,):
                        if isinstance(x, Var):
                            add(x, "number")

        lits = list(c.body) + [x for agg in _aggs(c.body) for x in agg.body]
        record_eqs: list[tuple[Var, Record]] = []
        for t in c.head.args:
            numeric(t)
        for lit in lits:
            for t in _lit_terms(lit):
                numeric(t)
            if isinstance(lit, Atom):
                if not lit.negated:
                    for t, (_, ty) in zip(lit.args, self.prog.decls[lit.rel].columns):
                        constrain(t, ty)
                continue
            l, r = lit.left, lit.right
            if isinstance(l, Var) and isinstance(r, Var):
                parent[find(l.name)] = find(r.name)
            for a, b in ((l, r), (r, l)):
                if not isinstance(a, Var):
                    continue
                if isinstance(b, (Num, BinOp, Neg, Agg)):
                    add(a, "number")
                elif isinstance(b, Str):
                    add(a, "symbol")
                elif isinstance(b, Record) and lit.op == "=":
                    record_eqs.append((a, b))
            for side in (l, r):
                if isinstance(side, Agg) and side.target is not None:
                    for s in _subterms(side.target):
                        if isinstance(s, Var):
                            add(s, "number")

        def class_types() -> dict[str, tuple[str, int, str, int]]:
            """class root -> (type, line, other type, other line) with other == '' when consistent."""
            out: dict[str, tuple[str, int, str, int]] = {}
            for name, lst in cons.items():
                root = find(name)
                for ty, line in lst:
                    if root not in out:
                        out[root] = (ty, line, "", 0)
                        continue
                    cur, cline, bad, bline = out[root]
                    if bad:
                        continue
                    m = self.meet(cur, ty)
                    out[root] = (m, cline, "", 0) if m else (cur, cline, ty, line)
            return out

        done: set[int] = set()
        progress = True
        while progress:  # record destructuring: `l = [h, t]` types h and t from l's type
            progress = False
            typed = class_types()
            for v, rec in record_eqs:
                ty = typed.get(find(v.name))
                if id(rec) in done or not ty or ty[2] or self.prog.kind(ty[0]) != "record":
                    continue
                fields = self.prog.types[ty[0]].fields
                if len(fields) != len(rec.items):
                    raise DialectError(f"record of {len(rec.items)} element(s) where {ty[0]} has "
                                       f"{len(fields)} field(s)", f, rec.line)
                constrain(rec, ty[0])
                done.add(id(rec))
                progress = True
        typed = class_types()
        for name in sorted(cons):
            ty, line, bad, bline = typed[find(name)]
            if bad:
                raise DialectError(f"cannot deduce a type for variable {name}: it is used as {ty} "
                                   f"(line {line}) and as {bad} (line {bline})", f, bline)

        def sink(t, ty: str, negated: bool, rel: str) -> None:
            if isinstance(t, Record) and self.prog.kind(ty) == "record":
                for x, (_, fty) in zip(t.items, self.prog.types[ty].fields):
                    sink(x, fty, negated, rel)
                return
            if not isinstance(t, Var) or t.name not in cons:
                return
            vt = typed[find(t.name)][0]
            if negated:
                ok = vt == ty or (self.prog.kind(ty) != "record" and self.base(vt) == self.base(ty))
            else:
                ok = self.meet(vt, ty) == vt or vt == self.base(ty)
            if not ok:
                raise DialectError(f"variable {t.name} has type {vt} but {rel} expects {ty}", f, t.line)

        for atom in [c.head] + [x for x in lits if isinstance(x, Atom) and x.negated]:
            for t, (_, ty) in zip(atom.args, self.prog.decls[atom.rel].columns):
                sink(t, ty, atom.negated, atom.rel)

    # ------------------------------------------------------------ stratification
    def stratify(self) -> None:
        edges: dict[str, set[str]] = {r: set() for r in self.prog.decls}
        neg: list[tuple[str, str, Clause]] = []
        for c in self.prog.clauses:
            h = c.head.rel
            for lit in c.body:
                if isinstance(lit, Atom):
                    edges[h].add(lit.rel)
                    if lit.negated:
                        neg.append((h, lit.rel, c))
            for agg in _aggs(c.body):
                for lit in agg.body:
                    if isinstance(lit, Atom):
                        edges[h].add(lit.rel)
                        neg.append((h, lit.rel, c))
        comp = _scc(edges)
        for h, b, c in neg:
            if comp[h] == comp[b]:
                raise DialectError(f"the program is not stratified: {h} depends through negation or an "
                                   f"aggregate on {b}, which depends on {h}", c.file, c.line)


def _scc(edges: dict[str, set[str]]) -> dict[str, int]:
    """Tarjan's strongly connected components (iterative): node -> component id."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    comp: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp[w] = index[v]
                    if w == v:
                        break
    return comp


# ============================================================================ public entry points


def parse_program(main: Path | str) -> Program:
    """Parse and check `main` and its includes; raise DialectError outside the subset."""
    main = Path(main)
    if not main.is_file():
        raise DialectError(f"Datalog file not found: {main}", str(main), 0)
    loader = _Loader(main.resolve())
    loader.load(main)
    _Checker(loader.program).run()
    return loader.program


def predicate_name(rel: str) -> str:
    return rel[0].lower() + rel[1:]


def predicate_names(prog: Program) -> dict[str, str]:
    """Relation -> clingo predicate (first letter lowercased); refuses collisions."""
    out: dict[str, str] = {}
    back: dict[str, str] = {}
    for name, d in prog.decls.items():
        pred = predicate_name(name)
        if pred == "not" or not re.fullmatch(r"[a-z][A-Za-z0-9_]*", pred):
            raise DialectError(f"relation name {name} cannot be translated to a clingo predicate",
                               d.file, d.line)
        if pred in back:
            raise DialectError(f"relations {back[pred]} and {name} both translate to the clingo "
                               f"predicate {pred}", d.file, d.line)
        back[pred] = name
        out[name] = pred
    return out


@dataclass
class Translation:
    text: str
    origins: list[tuple[str, int] | None]  # per line of `text` (1-based line i -> origins[i-1])
    predicates: dict[str, str]  # relation -> clingo predicate

    def origin(self, line: int) -> tuple[str, int] | None:
        return self.origins[line - 1] if 1 <= line <= len(self.origins) else None


class _Emitter:
    def __init__(self, preds: dict[str, str]) -> None:
        self.preds = preds
        self.fresh = 0

    def term(self, t, wild_vars: list[str] | None = None) -> str:
        if isinstance(t, Var):
            return "V_" + t.name
        if isinstance(t, Wild):
            if wild_vars is not None:
                self.fresh += 1
                name = f"W_{self.fresh}"
                wild_vars.append(name)
                return name
            return "_"
        if isinstance(t, Num):
            return str(t.value)
        if isinstance(t, Str):
            return f'"{t.value}"'
        if isinstance(t, Nil):
            return "nil"
        if isinstance(t, Record):
            items = [self.term(x, wild_vars) for x in t.items]
            return "(" + ",".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(t, BinOp):
            op = "\\" if t.op == "%" else t.op
            return f"({self.term(t.left)} {op} {self.term(t.right)})"
        if isinstance(t, Neg):
            return f"-({self.term(t.arg)})"
        raise AssertionError(t)

    def atom(self, a: Atom, wild_vars: list[str] | None = None) -> str:
        s = self.preds[a.rel] + "(" + ",".join(self.term(x, wild_vars) for x in a.args) + ")"
        return "not " + s if a.negated else s

    def literal(self, lit, guards: list[str]) -> str:
        if isinstance(lit, Atom):
            return self.atom(lit)
        agg = lit.left if isinstance(lit.left, Agg) else lit.right if isinstance(lit.right, Agg) else None
        if agg is None:
            return f"{self.term(lit.left)} {lit.op} {self.term(lit.right)}"
        var = self.term(lit.right if agg is lit.left else lit.left)
        wild_vars: list[str] | None = [] if agg.kind == "count" else None
        body = ", ".join(self.atom(x, wild_vars if isinstance(x, Atom) and not x.negated else None)
                         if isinstance(x, Atom) else self.literal(x, guards) for x in agg.body)
        tup = ["V_" + n for n in agg.locals] + (wild_vars or [])
        if agg.kind != "count":
            tup = [self.term(agg.target)] + tup
        if agg.kind == "min":
            guards.append(f"{var} != #sup")
        elif agg.kind == "max":
            guards.append(f"{var} != #inf")
        return f"{var} = #{agg.kind}{{ {','.join(tup)} : {body} }}"

    def clause(self, c: Clause) -> str:
        head = self.atom(c.head)
        if not c.body:
            return head + "."
        guards: list[str] = []
        lits = [self.literal(x, guards) for x in c.body]
        return head + " :- " + ", ".join(lits + guards) + "."


def translate(prog: Program, shown: Sequence[str] | None = None) -> Translation:
    """clingo text for `prog`, one line per clause; `#show` for `shown` (default: every .output)."""
    preds = predicate_names(prog)
    em = _Emitter(preds)
    lines: list[str] = []
    origins: list[tuple[str, int] | None] = []
    for c in prog.clauses:
        lines.append(em.clause(c))
        origins.append((c.file, c.line))
    shown = list(prog.outputs) if shown is None else list(shown)
    for name in shown:
        lines.append(f"#show {preds[name]}/{len(prog.decls[name].columns)}.")
        origins.append(prog.outputs.get(name))
    if not shown:
        lines.append("#show.")
        origins.append(None)
    return Translation("\n".join(lines) + "\n", origins, preds)
