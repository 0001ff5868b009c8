"""Scanning HLO text: comments, bracket depth and string literals, a cursor
for the statement parser, and splitting at top-level separators. Every loop
here is iterative, so bracket nesting depth costs no stack."""
from __future__ import annotations

import re

from dlverify.errors import InputError

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}
_SPECIAL = re.compile(r'["(\[{)\]}]|/\*')


def strip_comments_and_depth(line: str, depth: int, in_str: bool) -> tuple[str, int, bool]:
    """Remove /*...*/ comments outside strings; return the bracket depth and the
    in-string state after the line."""
    out = []
    i, n = 0, len(line)
    while i < n:
        if in_str:
            j = i
            while j < n:
                c = line[j]
                if c == "\\":
                    j += 2
                    continue
                if c == '"':
                    break
                j += 1
            if j >= n:
                out.append(line[i:])
                return "".join(out), depth, True
            out.append(line[i:j + 1])
            i = j + 1
            in_str = False
            continue
        m = _SPECIAL.search(line, i)
        if m is None:
            out.append(line[i:])
            break
        out.append(line[i:m.start()])
        tok = m.group()
        if tok == "/*":
            end = line.find("*/", m.end())
            i = n if end < 0 else end + 2
            continue
        out.append(tok)
        i = m.end()
        if tok == '"':
            in_str = True
        elif tok in _OPEN:
            depth += 1
        else:
            depth -= 1
    return "".join(out), depth, in_str


def unescape(s: str) -> str:
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            out.append({"n": "\n", "t": "\t", "r": "\r"}.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Cursor:
    """A position in one statement's text, for the recursive-descent parser."""

    def __init__(self, s: str, file: str, line: int) -> None:
        self.s, self.i, self.file, self.line = s, 0, file, line

    def error(self, msg: str) -> InputError:
        return InputError(msg, self.file, self.line)

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.s)

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def eat(self, tok: str) -> bool:
        self.ws()
        if self.s.startswith(tok, self.i):
            self.i += len(tok)
            return True
        return False

    def expect(self, tok: str, what: str) -> None:
        if not self.eat(tok):
            got = self.s[self.i:self.i + 30] or "end of line"
            raise self.error(f"expected {what} ('{tok}'), found {got!r}")

    def regex(self, pat: re.Pattern[str]) -> str | None:
        self.ws()
        m = pat.match(self.s, self.i)
        if m is None:
            return None
        self.i = m.end()
        return m.group()

    def balanced(self) -> str:
        """At an opening bracket: return the text up to its match (exclusive)
        and move past the match."""
        self.ws()
        start = self.i
        end = scan(self.s, self.i, to_close=True)
        if end < 0:
            raise self.error("unbalanced brackets (truncated instruction?)")
        self.i = end + 1
        return self.s[start + 1:end]

    def until_comma(self) -> str:
        """Text up to the next comma at bracket depth 0 (or the end)."""
        self.ws()
        start = self.i
        self.i = scan(self.s, self.i, to_close=False)
        return self.s[start:self.i].strip()


def scan(s: str, i: int, to_close: bool, sep: str = ",") -> int:
    """From index i, skipping string literals: the index of the bracket closing
    the one at i (`to_close`; -1 if none), or of the next `sep` at bracket depth 0
    (or len(s))."""
    depth, in_str = 0, False
    while i < len(s):
        c = s[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if to_close and depth == 0:
                return i
        elif c == sep and depth == 0 and not to_close:
            return i
        i += 1
    return -1 if to_close else i


def split_top(s: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets and strings."""
    parts, start = [], 0
    while start <= len(s):
        end = scan(s, start, to_close=False, sep=sep)
        parts.append(s[start:end])
        start = end + 1
    return [p.strip() for p in parts if p.strip()]


NAME = re.compile(r"%?[A-Za-z0-9_][\w.\-]*")
DTYPE_TOKEN = re.compile(r"[a-z][a-z0-9]*(?=\[)")
OPCODE_TOKEN = re.compile(r"[a-z][a-z0-9\-]*(?=\s*\()")
ATTR_KEY = re.compile(r"[A-Za-z_][\w.\-]*")
