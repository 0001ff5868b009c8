"""Tokens of Soufflé's syntax, with the line each starts on.

Refuses early what cannot be in the subset at the token level (float and
non-decimal literals, string escapes and tabs, `?` identifiers).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from dlverify.engine.syntax import refuse
from dlverify.errors import DialectError

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


def lex_text(text: str, file: str) -> list[Tok]:
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
                    raise refuse("a backslash escape in a string literal", file, line)
                if text[j] == "\t":
                    raise refuse("a tab character in a string literal", file, line)
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
                raise refuse("a floating-point literal", file, line)
            if j < n and (text[j].isalnum() or text[j] == "_"):
                raise refuse(f"the number literal '{text[i:j + 1]}...' (only decimal integers)", file, line)
            toks.append(Tok("int", int(text[i:j]), line))
            i = j
            continue
        m = _IDENT.match(text, i)
        if m:
            j = m.end()
            if j < n and text[j] == "?":
                raise refuse("'?' in an identifier", file, line)
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
