"""The Soufflé subset of datalog/README.md: one entry point over its four parts.

syntax.py (the tree), parser.py (text -> tree, refusing constructs outside the
subset), checker.py and typecheck.py (what Soufflé would reject), translate.py
(tree -> clingo text). `parse_program(main)` = parse + check.
"""
from __future__ import annotations

from pathlib import Path

from dlverify.engine.checker import check_program
from dlverify.engine.parser import load_program
from dlverify.engine.syntax import INT_MAX, INT_MIN, Program
from dlverify.engine.translate import Translation, predicate_name, predicate_names, translate


def parse_program(main: Path | str) -> Program:
    """Parse and check `main` and its includes; raise DialectError outside the subset or
    where Soufflé would reject the program."""
    program = load_program(Path(main))
    check_program(program)
    return program


__all__ = ["INT_MAX", "INT_MIN", "Program", "Translation", "parse_program", "predicate_name",
           "predicate_names", "translate"]
