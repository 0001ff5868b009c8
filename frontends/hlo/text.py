"""Scanning HLO text: comments, bracket depth and string literals, a cursor
for the statement parser, and splitting at top-level separators. Every loop
here is iterative, so bracket nesting depth costs no stack."""
from __future__ import annotations

import re

from dlverify.errors import InputError

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}
# The scanners jump from one interesting character to the next with a regex
# search, so long runs of plain text (metadata strings of megabytes) cost no
# Python-level loop iterations and no memory beyond the slices returned.
_SPECIAL = re.compile(r'["(\[{)\]}]|/\*')
_STRING_REST = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)
_ESCAPE = re.compile(r"\\(.)", re.S)
_ESCAPED = {"n": "\n", "t": "\t", "r": "\r"}


def string_end(s: str, i: int) -> int:
    """Inside a string literal at index i: the index of its closing quote, or
    -1 if the string does not end in `s`. One regex match with possessive
    repeats: no backtracking state, whatever the length of the string."""
    m = _STRING_REST.match(s, i)
    return -1 if m is None else m.end() - 1


def strip_comments_and_depth(line: str, depth: int, in_str: bool) -> tuple[str, int, bool]:
    """Remove /*...*/ comments outside strings; return the bracket depth and the
    in-string state after the line."""
    kept: list[str] = []       # text before each removed comment
    seg = 0                    # start of the text not yet copied to `kept`
    i, n = 0, len(line)
    while i < n:
        if in_str:
            j = string_end(line, i)
            if j < 0:
                break
            i = j + 1
            in_str = False
            continue
        m = _SPECIAL.search(line, i)
        if m is None:
            break
        tok = m.group()
        if tok == "/*":
            kept.append(line[seg:m.start()])
            end = line.find("*/", m.end())
            i = seg = n if end < 0 else end + 2
            continue
        i = m.end()
        if tok == '"':
            in_str = True
        elif tok in _OPEN:
            depth += 1
        else:
            depth -= 1
    if not kept:
        return line, depth, in_str
    kept.append(line[seg:])
    return "".join(kept), depth, in_str


def unescape(s: str) -> str:
    """The value of a string literal's body: \\n, \\t, \\r and \\<c> -> <c>.
    Done with C-level replaces (an escaped backslash parked on NUL first), so a
    megabyte of escapes costs no Python call per escape."""
    if "\\" not in s:
        return s
    if "\0" in s:
        return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), s)
    s = s.replace("\\\\", "\0")
    lone = s.endswith("\\")  # a trailing backslash escapes nothing: kept
    if lone:
        s = s[:-1]
    for code, char in _ESCAPED.items():
        s = s.replace("\\" + code, char)
    # Every backslash left introduces an escape that stands for the next character.
    return s.replace("\\", "").replace("\0", "\\") + ("\\" if lone else "")


_SCAN_STOP = {sep: re.compile(r'["(\[{)\]}' + re.escape(sep) + "]") for sep in (",", ";", " ")}


def scan(s: str, i: int, to_close: bool, sep: str = ",") -> int:
    """From index i, skipping string literals: the index of the bracket closing
    the one at i (`to_close`; -1 if none), or of the next `sep` at bracket depth 0
    (or len(s))."""
    stop = _SCAN_STOP.get(sep) or re.compile(r'["(\[{)\]}' + re.escape(sep) + "]")
    depth, n = 0, len(s)
    while i < n:
        m = stop.search(s, i)
        if m is None:
            break
        c, i = m.group(), m.start()
        if c == '"':
            j = string_end(s, i + 1)
            if j < 0:
                break
            i = j + 1
            continue
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if to_close and depth == 0:
                return i
        elif depth == 0 and not to_close:
            return i
        i += 1
    return -1 if to_close else n


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
