"""Finding and running the `@dlverify.case` functions of a Python file."""
from __future__ import annotations

import importlib.util
import inspect
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from dlverify.case import CASE_MARKER, Case
from dlverify.errors import InputError
from dlverify.verdict import CaseOutcome


def split_target(target: str) -> tuple[Path, str | None]:
    """`PATH.py` or `PATH.py::NAME`."""
    path, _, name = target.partition("::")
    return Path(path), (name or None)


def load_cases(path: Path, name: str | None = None) -> list[tuple[str, Callable[[], Case]]]:
    if not path.is_file():
        raise InputError("no such file", str(path))
    mod_name = f"dlverify_cases_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise InputError("not a Python file", str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look the module up by name
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise InputError(f"syntax error: {e.msg}", str(path), e.lineno or 0) from None
    except Exception as e:  # the user's module failed at import time
        sys.modules.pop(mod_name, None)
        line = _user_line(e, path)
        raise InputError(f"importing failed: {type(e).__name__}: {e}", str(path), line) from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    found = [(n, f) for n, f in vars(module).items() if callable(f) and getattr(f, CASE_MARKER, False)]
    if name is not None:
        found = [(n, f) for n, f in found if n == name]
        if not found:
            raise InputError(f"no case named {name!r} (cases are functions decorated with "
                             "@dlverify.case)", str(path))
    elif not found:
        raise InputError("no @dlverify.case functions in this file", str(path))
    return found


def _def_line(fn: Callable) -> int:
    try:
        return inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return 0


def _user_line(e: BaseException, path: Path) -> int:
    line = 0
    for fr in traceback.extract_tb(e.__traceback__):
        if Path(fr.filename).resolve() == path.resolve():
            line = fr.lineno or 0
    return line


def run_case(path: Path, name: str, fn: Callable[[], Case], engine: str = "auto",
             keep_facts: Path | None = None) -> CaseOutcome:
    """Build and verify one case. Bad input inside the case raises InputError."""
    from dlverify.api import verify_jax

    t0 = time.perf_counter()
    try:
        c = fn()
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"case {name} failed to build: {type(e).__name__}: {e}", str(path),
                         _user_line(e, path)) from None
    if not isinstance(c, Case):
        raise InputError(f"case {name} returned {type(c).__name__}, not dlverify.Case", str(path))
    if c.expect not in ("verified", "bug"):
        raise InputError(f"case {name}: expect must be 'verified' or 'bug', not {c.expect!r}",
                         str(path))
    keep = keep_facts / name if keep_facts is not None else None
    try:
        res = verify_jax(c.seq, c.dist, *c.args, engine=engine, keep_facts=keep,  # type: ignore[arg-type]
                         name=name)
    except InputError as e:
        if not e.file:  # nothing better known: point at the case
            e.file, e.line = str(path), _def_line(fn)
        raise
    return CaseOutcome(name, str(path), c.expect, res, seconds=time.perf_counter() - t0)
