"""Pattern files: TOML with one `[[pattern]]` table per pattern, each compiled by
pyformlang into a minimal DFA over letters (conjunctions of label tests).

    [[pattern]]
    name = "nonlinear-on-partial"
    regex = "partial partial* elementwise_nonlinear&unrelated"
    explanation = "a partial sum reaches a nonlinear op"
    advice = "reduce it (psum) first"        # optional

The regex syntax is pyformlang's: letters separated by spaces (or `.`), `|` (or `+`)
for union, `*` for repetition, parentheses, `$` for the empty word. A letter is
`label`, `!label` or several joined by `&`; the labels are those of
dlverify/patterns/alphabet.py.
"""
from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from dlverify.errors import InputError
from dlverify.patterns.alphabet import ALPHABET

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}$")
KEYS = {"name", "regex", "explanation", "advice"}
MAX_REGEX = 2000   # characters: a pattern is a short expression, not a program
MAX_STATES = 200   # of the minimal DFA
MAX_SUBSETS = 2000  # DFA states before minimisation: determinising can blow up exponentially


@dataclass(frozen=True)
class Test:
    """One label test of a letter: the op has (or, negated, lacks) the label."""

    label: str
    negated: bool = False


@dataclass(frozen=True, order=True)
class Transition:
    source: int
    letter: str
    target: int


@dataclass(frozen=True)
class Pattern:
    """A compiled pattern: its minimal DFA with states numbered from 0 (the start)."""

    name: str
    regex: str
    explanation: str
    advice: str
    file: str                                 # where it was read ("" when built in code)
    line: int
    finals: tuple[int, ...]
    transitions: tuple[Transition, ...]
    letters: tuple[tuple[str, tuple[Test, ...]], ...]   # each letter and its tests

    @property
    def start(self) -> int:
        return 0


def parse_letter(letter: str) -> tuple[Test, ...]:
    """`a&!b` -> (Test(a), Test(b, negated)); ValueError naming an unknown label."""
    tests = []
    for part in letter.split("&"):
        negated = part.startswith("!")
        label = part[1:] if negated else part
        if label not in ALPHABET:
            raise ValueError(f"unknown label {label!r} in letter {letter!r} (the labels are op "
                             f"kinds, families, classes and view classes: README 'Bug-pattern "
                             f"queries')")
        tests.append(Test(label, negated))
    return tuple(tests)


def compile_pattern(name: str, regex: str, explanation: str, advice: str = "", file: str = "",
                    line: int = 0) -> Pattern:
    """Compile `regex` into a minimal DFA; ValueError saying what is wrong."""
    from pyformlang.regular_expression import MisformedRegexError, Regex

    if not NAME.match(name):
        raise ValueError(f"pattern name {name!r}: use lowercase letters, digits, '-' and '_' "
                         "(at most 64)")
    if not regex.strip():
        raise ValueError(f"pattern {name}: empty regex")
    if len(regex) > MAX_REGEX or "\\" in regex or "\n" in regex:
        raise ValueError(f"pattern {name}: the regex must be one line of at most {MAX_REGEX} "
                         "characters without backslashes")
    try:
        dfa = _determinise(Regex(regex).to_epsilon_nfa(), name).minimize()
    except MisformedRegexError as e:
        raise ValueError(f"pattern {name}: malformed regex: {str(e).split(' Regex:')[0]}") from None
    except RecursionError:
        raise ValueError(f"pattern {name}: regex nested too deeply") from None
    letters = {}
    for sym in sorted(str(s.value) for s in dfa.symbols):
        try:
            letters[sym] = parse_letter(sym)
        except ValueError as e:
            raise ValueError(f"pattern {name}: {e}") from None
    if dfa.is_empty():
        raise ValueError(f"pattern {name}: the regex matches no path")
    if dfa.start_state is not None and dfa.start_state in dfa.final_states:
        raise ValueError(f"pattern {name}: the regex matches the empty path: a match must read "
                         "at least one op")
    if len(dfa.states) > MAX_STATES:
        raise ValueError(f"pattern {name}: its automaton has {len(dfa.states)} states (at most "
                         f"{MAX_STATES})")
    # number the states: the start 0, the others in a stable order
    others = sorted((s for s in dfa.states if s != dfa.start_state), key=str)
    number = {dfa.start_state: 0} | {s: i + 1 for i, s in enumerate(others)}
    transitions = sorted(Transition(number[a], str(sym.value), number[b]) for a, sym, b in dfa)
    return Pattern(name, regex, explanation, advice, file, line,
                   tuple(sorted(number[s] for s in dfa.final_states)), tuple(transitions),
                   tuple(letters.items()))


def _determinise(enfa, name: str):
    """The subset construction of an epsilon-NFA, refused beyond MAX_SUBSETS states
    (pyformlang's own has no bound: `(a|b)* a (a|b) ... (a|b)` takes minutes)."""
    from pyformlang.finite_automaton import DeterministicFiniteAutomaton, Epsilon, State

    moves: dict = {}
    for a, sym, b in enfa:
        if not isinstance(sym, Epsilon):
            moves.setdefault(a, {}).setdefault(sym, set()).add(b)
    start = frozenset(enfa.eclose_iterable(enfa.start_states))
    number = {start: 0}
    dfa = DeterministicFiniteAutomaton()
    dfa.add_start_state(State(0))
    todo = [start]
    while todo:
        subset = todo.pop()
        if subset & enfa.final_states:
            dfa.add_final_state(State(number[subset]))
        by_symbol: dict = {}
        for q in subset:
            for sym, targets in moves.get(q, {}).items():
                by_symbol.setdefault(sym, set()).update(targets)
        for sym, targets in by_symbol.items():
            nxt = frozenset(enfa.eclose_iterable(targets))
            if nxt not in number:
                if len(number) >= MAX_SUBSETS:
                    raise ValueError(f"pattern {name}: its automaton grows beyond {MAX_SUBSETS} "
                                     "states: write a simpler regex")
                number[nxt] = len(number)
                todo.append(nxt)
            dfa.add_transition(State(number[subset]), sym, State(number[nxt]))
    return dfa


class _Lines:
    """Where each `[[pattern]]` table and its keys stand in the file, for error lines."""

    HEADER = re.compile(r"\s*\[\[\s*pattern\s*\]\]")

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.starts = [i for i, line in enumerate(self.lines) if self.HEADER.match(line)]

    def table(self, index: int) -> int:
        """The line (1-based) of table `index`'s header; 0 when not written as one."""
        return self.starts[index] + 1 if index < len(self.starts) else 0

    def key(self, index: int, key: str) -> int:
        """The line of `key = ...` inside table `index` (else its header's line)."""
        if index >= len(self.starts):
            return 0
        end = self.starts[index + 1] if index + 1 < len(self.starts) else len(self.lines)
        pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
        found = [i for i in range(self.starts[index], end) if pattern.match(self.lines[i])]
        return found[0] + 1 if found else self.table(index)

    def top_level(self, key: str) -> int:
        pattern = re.compile(rf"\s*\[*\s*{re.escape(key)}\b")
        return next((i + 1 for i, line in enumerate(self.lines) if pattern.match(line)), 0)


def _read_toml(path: Path) -> tuple[str, dict]:
    where = str(path)
    if not path.is_file():
        raise InputError("--patterns: " + ("not a file" if path.exists() else "no such file"), where)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"--patterns: not UTF-8 text (byte {e.start})", where,
                         data[: e.start].count(b"\n") + 1) from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"at line (\d+)", str(e))
        raise InputError(f"--patterns: not valid TOML: {str(e).split(' (at')[0]}", where,
                         int(m.group(1)) if m else 0) from None
    except RecursionError:
        raise InputError("--patterns: nested too deeply", where) from None


def load_patterns(path: Path) -> list[Pattern]:
    """The patterns of one TOML file; InputError naming the file (and line) otherwise."""
    path = Path(path)
    where = str(path)
    text, doc = _read_toml(path)
    at = _Lines(text)
    extra = set(doc) - {"pattern"}
    if extra:
        raise InputError(f"--patterns: unknown table or key {min(extra)!r} (expected "
                         "[[pattern]] tables)", where, at.top_level(min(extra)))
    tables = doc.get("pattern", [])
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise InputError("--patterns: expected one or more [[pattern]] tables", where)
    out: list[Pattern] = []
    for i, t in enumerate(tables):
        unknown = set(t) - KEYS
        missing = {"name", "regex", "explanation"} - set(t)
        if unknown or missing:
            what = f"unknown key {min(unknown)!r}" if unknown else f"missing key {min(missing)!r}"
            raise InputError(f"--patterns: pattern {i + 1}: {what} (keys: name, regex, "
                             "explanation, advice)", where,
                             at.key(i, min(unknown)) if unknown else at.table(i))
        bad = sorted(k for k in t if not isinstance(t[k], str))
        if bad:
            raise InputError(f"--patterns: pattern {i + 1}: {bad[0]} must be a string", where,
                             at.key(i, bad[0]))
        try:
            p = compile_pattern(t["name"], t["regex"], t["explanation"], t.get("advice", ""),
                                where, at.key(i, "regex"))
        except ValueError as e:
            key = "name" if str(e).startswith("pattern name") else "regex"
            raise InputError(f"--patterns: {e}", where, at.key(i, key)) from None
        if any(q.name == p.name for q in out):
            raise InputError(f"--patterns: pattern {p.name} is defined twice", where, at.key(i, "name"))
        out.append(p)
    return out


def shipped_files() -> list[Path]:
    """The pattern files installed with dlverify (dlverify/patterns/*.toml)."""
    folder = Path(str(resources.files("dlverify.patterns")))
    return sorted(folder.glob("*.toml"))


def combine(groups: list[list[Pattern]]) -> tuple[Pattern, ...]:
    """All patterns of several files; a name defined in two files is an InputError."""
    seen: dict[str, Pattern] = {}
    for group in groups:
        for p in group:
            if p.name in seen:
                raise InputError(f"--patterns: pattern {p.name} is already defined in "
                                 f"{seen[p.name].file}:{seen[p.name].line}", p.file, p.line)
            seen[p.name] = p
    return tuple(seen.values())


@functools.lru_cache(maxsize=1)
def shipped_patterns() -> tuple[Pattern, ...]:
    """The shipped patterns, compiled once per process (they are part of the install)."""
    return combine([load_patterns(f) for f in shipped_files()])


def load_pattern_set(files: list[Path] | tuple[Path, ...] = ()) -> tuple[Pattern, ...]:
    """The shipped patterns, then those of `files` (the --patterns options)."""
    return combine([list(shipped_patterns()), *(load_patterns(f) for f in files)])
