"""The installed rule program, parsed and checked, kept on disk between runs.

Parsing and checking datalog/main.dl and its includes costs about a second
(lexing, parsing, Soufflé's checks and type inference), paid by every process
that runs the rules: each CLI case's child, each benchmark run. Stored here
(pickled, in $XDG_CACHE_HOME/dlverify/rules or ~/.cache/dlverify/rules), the
checked program loads in a few hundredths of a second.

Never stale: an entry is found by a key over the parser's and checker's own
source and the Python version, and it holds the bytes of every rule file the
parse read; it is used only when each of those files still has exactly those
bytes (as the in-process cache of dlverify.engine checks too), else the rules
are parsed again. Only the installed rule set is stored (a `--rules` folder is
parsed each run: research rule sets come and go, their entries would pile up).
A missing, unreadable or unwritable cache only costs the parse.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from importlib import resources
from pathlib import Path

from dlverify.engine.syntax import Program

# The modules whose code decides what a parse yields.
_PARSER_MODULES = ("lexer.py", "parser.py", "syntax.py", "checker.py", "typecheck.py",
                   "dialect.py", "rules_cache.py")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dlverify" / "rules"


@functools.lru_cache(maxsize=1)
def _parser_digest() -> str:
    h = hashlib.sha256(sys.version.encode())
    here = Path(__file__).parent
    for name in _PARSER_MODULES:
        h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    return h.hexdigest()[:24]


def _entry(main: Path) -> Path | None:
    """Where the parse of `main` is kept; None unless it is the installed rule set."""
    installed = Path(str(resources.files("dlverify.datalog").joinpath("main.dl"))).resolve()
    if main != installed:
        return None
    key = hashlib.sha256(f"{_parser_digest()}\0{main}".encode()).hexdigest()[:24]
    return cache_dir() / f"program-{key}.pickle"


def same_bytes(texts: dict[Path, bytes]) -> bool:
    """Every file still holds exactly these bytes."""
    try:
        return all(p.read_bytes() == text for p, text in texts.items())
    except OSError:
        return False


def load(main: Path) -> tuple[Program, dict[Path, bytes]] | None:
    """The stored parse of `main` (resolved) and the file bytes it was made from,
    when every one of those files is unchanged; None otherwise."""
    path = _entry(main)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            program, texts = pickle.load(f)
    except Exception:  # noqa: BLE001: missing, truncated or from elsewhere: parse instead
        return None
    if not isinstance(program, Program) or not isinstance(texts, dict) or not texts \
            or not same_bytes(texts):
        return None
    return program, texts


def store(main: Path, program: Program, texts: dict[Path, bytes]) -> None:
    """Keep the parse of `main` (written whole or not at all: a temporary file renamed)."""
    path = _entry(main)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".program-")
        with os.fdopen(fd, "wb") as f:
            pickle.dump((program, texts), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except (OSError, pickle.PicklingError):
        try:
            os.unlink(tmp)
        except (OSError, UnboundLocalError):
            pass
