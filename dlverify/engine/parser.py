"""Reads a main .dl file and its `#include`s into a `Program` (syntax.py).

The lexer and the recursive-descent parser accept Soufflé's syntax and refuse,
with file and line, every construct outside the subset of datalog/README.md.
Semantic checks (declarations, types, groundedness, stratification, plans) are
in checker.py.
"""
from __future__ import annotations

import re
from pathlib import Path

from dlverify.engine.lexer import Tok, lex_text
from dlverify.engine.syntax import (Agg, Atom, BinOp, Clause, Cmp, Decl, Neg, Nil, Num, Plan, Program,
                                    Record, Str, TypeDef, Var, Wild, refuse)
from dlverify.errors import DialectError

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
            toks = lex_text(text, str(path))
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
        return refuse(what, self.file, (tok or self.peek()).line)

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
        """`.plan v:(i, ...), ...`: recorded on the rule it follows; checker.py validates it."""
        rule = self.prog.clauses[-1]
        while True:
            v = self.peek()
            if v.kind != "int":
                raise self.err(f"expected a version number in .plan but found {self.show(v)}")
            self.next()
            self.expect(":")
            self.expect("(")
            order: list[int] = []
            if not self.at(")"):
                while True:
                    if self.peek().kind != "int":
                        raise self.err(f"expected an atom index in .plan but found {self.show(self.peek())}")
                    order.append(self.next().value)
                    if not self.at(","):
                        break
                    self.next()
            self.expect(")")
            rule.plans.append(Plan(v.value, tuple(order), v.line))
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



def load_program(main: Path) -> Program:
    """Parse `main` and its includes (no semantic checks: see checker.py)."""
    main = Path(main)
    if not main.is_file():
        raise DialectError(f"Datalog file not found: {main}", str(main), 0)
    loader = _Loader(main.resolve())
    loader.load(main)
    return loader.program
