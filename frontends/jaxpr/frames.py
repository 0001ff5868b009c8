"""Which user frame an op is reported at.

JAX records the whole chain of user frames of every op. The innermost one is
not always where a developer would look: a collective wrapped in a thin helper
(`def allreduce(x): return lax.psum(x, "tp")`) is written at the helper's line
for every call, and a utility module shared by many programs is rarely where
the program went wrong. The call that passed the wrong value, or forgot the
helper, is in the caller. So an op is reported at:

1. the innermost frame in the program's own file (the file defining `seq_fn` or
   `dist_fn`), when the chain has one; otherwise the innermost frame;
2. and from there, past every frame inside a *thin wrapper*, a function whose
   body is one call of plain arguments, to its caller, as long as a caller is
   left in the chosen file.

The whole chain is kept (`SourceLoc.frames`); reports print it next to the
chosen frame ("called from"), so nothing is lost when the helper itself is
wrong.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import linecache
from typing import Any, Callable

from dlverify.ir import Frame, Graph, SourceLoc


def home_file(fn: Callable[..., Any]) -> str:
    """The file defining a user function (through functools.partial and
    decorators that keep `__wrapped__`); "" when there is none."""
    while True:
        inner = getattr(fn, "func", None) or getattr(fn, "__wrapped__", None)
        if inner is None or inner is fn:
            break
        fn = inner
    try:
        return inspect.getsourcefile(fn) or ""
    except TypeError:   # a builtin or a callable object without source
        return ""


class _Wrappers:
    """Per file, the line spans of functions whose body is one statement."""

    def __init__(self) -> None:
        self._spans: dict[str, list[tuple[int, int]]] = {}
        self._inside: dict[tuple[str, int], bool] = {}   # ops share lines: answer each once

    def _file_spans(self, file: str) -> list[tuple[int, int]]:
        if file not in self._spans:
            spans: list[tuple[int, int]] = []
            try:
                tree = ast.parse("".join(linecache.getlines(file)))
            except (SyntaxError, ValueError):
                tree = None
            for node in ast.walk(tree) if tree is not None else ():
                if isinstance(node, (ast.FunctionDef, ast.Lambda)) and _one_statement(node):
                    spans.append((node.lineno, node.end_lineno or node.lineno))
            self._spans[file] = spans
        return self._spans[file]

    def inside(self, fr: Frame) -> bool:
        key = (fr.file, fr.line)
        if key not in self._inside:
            self._inside[key] = any(lo <= fr.line <= hi for lo, hi in self._file_spans(fr.file))
        return self._inside[key]


def _one_statement(node: ast.FunctionDef | ast.Lambda) -> bool:
    """A thin wrapper: the body is one call whose arguments are plain names,
    attributes or constants (`return lax.psum(x, "tp")`), so the call is all the
    function does. A one-line function that computes (`return jnp.mean((f(x) - y)
    ** 2)`) is not one: its line is where the computation is written."""
    if isinstance(node, ast.Lambda):
        return _plain_call(node.body)
    body = [s for s in node.body
            if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]  # docstring
    return len(body) == 1 and isinstance(body[0], (ast.Return, ast.Expr)) \
        and body[0].value is not None and _plain_call(body[0].value)


def _plain_call(e: ast.expr) -> bool:
    def plain(a: ast.expr) -> bool:
        if isinstance(a, ast.Starred):
            a = a.value
        if isinstance(a, (ast.Tuple, ast.List)):
            return all(plain(x) for x in a.elts)
        return isinstance(a, (ast.Name, ast.Constant, ast.Attribute))
    return isinstance(e, ast.Call) and all(plain(a) for a in e.args) \
        and all(plain(k.value) for k in e.keywords)


def primary_frame(frames: tuple[Frame, ...], home: str, wrappers: _Wrappers) -> int:
    """Index in `frames` (innermost first) of the frame to report; see the module doc."""
    if not frames:
        return 0
    chosen = [i for i, f in enumerate(frames) if f.file == home] or list(range(len(frames)))
    k = 0
    while k + 1 < len(chosen) and wrappers.inside(frames[chosen[k]]):
        k += 1
    return chosen[k]


def prefer_callers(graph: Graph, home: str) -> None:
    """Set every op's reported frame in `graph` (traced from a function of `home`)."""
    wrappers = _Wrappers()
    for op in graph.ops:
        loc: SourceLoc = op.loc
        if len(loc.frames) > 1:
            k = primary_frame(loc.frames, home, wrappers)
            if k != loc.primary:
                op.loc = dataclasses.replace(loc, primary=k)
