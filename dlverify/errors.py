"""Errors that mean "bad input" (exit code 2): each renders as one line naming
the file and line it concerns."""
from __future__ import annotations


class InputError(Exception):
    """Bad input: malformed file, unknown op, shape mismatch, wrong spec."""

    def __init__(self, message: str, file: str = "", line: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file and self.line else (f"{self.file}: " if self.file else "")
        return f"{where}{self.message}"


class UnknownOpError(InputError):
    """An op the frontend has no translation for. Never treated as identity."""


class DialectError(InputError):
    """A .dl construct outside the documented Soufflé subset."""


class EngineError(InputError):
    """The Datalog engine failed or rejected the rules: one clear error (exit 2) with the
    engine's message and, when it names one, the .dl file and line."""
