"""Finding and running the `@dlverify.case` functions of a Python file."""
from __future__ import annotations

import importlib.util
import inspect
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from dlverify.case import CASE_MARKER, Case
from dlverify.errors import InputError
from dlverify.supervise import NULL_REPORTER, Reporter, is_out_of_memory
from dlverify.tasks import split_target  # noqa: F401: part of this module's interface
from dlverify.verdict import CaseOutcome

if TYPE_CHECKING:
    from dlverify.patterns import Pattern




def load_cases(path: Path, name: str | None = None) -> list[tuple[str, Callable[[], Case]]]:
    if not path.is_file():
        raise InputError("no such file" if not path.exists() else "not a file", str(path))
    mod_name = f"dlverify_cases_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise InputError("not a Python file (expected PATH.py or PATH.py::NAME)", str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look the module up by name
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise InputError(f"syntax error: {e.msg}", str(path), e.lineno or 0) from None
    except MemoryError:
        raise  # a limit, not bad input: exit 3
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # the user's module failed
        sys.modules.pop(mod_name, None)
        _not_ours(e)
        raise InputError(f"importing failed: {_what(e)}", str(path), _user_line(e, path)) from None
    finally:
        if str(path.resolve().parent) in sys.path:
            sys.path.remove(str(path.resolve().parent))
    found = [(n, f) for n, f in vars(module).items() if _is_case(f)]
    if name is not None:
        found = [(n, f) for n, f in found if n == name]
        if not found:
            raise InputError(f"no case named {name!r} (cases are functions decorated with "
                             "@dlverify.case)", str(path))
    elif not found:
        raise InputError("no @dlverify.case functions in this file", str(path))
    return found


def _is_case(obj: object) -> bool:
    try:
        return callable(obj) and getattr(obj, CASE_MARKER, False) is True
    except Exception:  # noqa: BLE001: a hostile __getattr__ is not a case
        return False


def _not_ours(e: BaseException) -> None:
    """Out of memory is a limit (exit 3), whoever's code hit it: not bad input."""
    if is_out_of_memory(e):
        raise MemoryError(str(e)) from None


def _what(e: BaseException) -> str:
    """What a user's code did, in words: sys.exit is not a crash of ours."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r})"
    if isinstance(e, KeyboardInterrupt):
        return "raised KeyboardInterrupt"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _def_line(fn: Callable) -> int:
    try:
        return inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return 0


def _user_line(e: BaseException, path: Path) -> int:
    """The innermost line of `path` in the traceback of `e`; 0 when it never ran there."""
    line = 0
    try:
        frames = traceback.extract_tb(e.__traceback__)
    except Exception:  # noqa: BLE001
        return 0
    for fr in frames:
        try:
            if Path(fr.filename).resolve() == path.resolve():
                line = fr.lineno or 0
        except (OSError, ValueError):
            continue
    return line


def build_case(path: Path, name: str, fn: Callable[[], Case]) -> Case:
    """Call the case function and check what it returned. Bad input raises InputError."""
    try:
        c = fn()
    except InputError as e:  # e.g. from dlverify.host_mesh: point at the user's line
        if not e.file:
            e.file, e.line = str(path), _user_line(e, path) or _def_line(fn)
        raise
    except MemoryError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        _not_ours(e)
        raise InputError(f"case {name} failed to build: {_what(e)}", str(path),
                         _user_line(e, path) or _def_line(fn)) from None
    if not isinstance(c, Case):
        raise InputError(f"case {name} returned {type(c).__name__}, not dlverify.Case", str(path))
    if not isinstance(c.expect, str) or c.expect not in ("verified", "bug"):
        raise InputError(f"case {name}: expect must be 'verified' or 'bug', not {c.expect!r}",
                         str(path))
    if not isinstance(c.args, (tuple, list)):
        raise InputError(f"case {name}: args must be a tuple of arrays or jax.ShapeDtypeStructs, "
                         f"not {type(c.args).__name__}", str(path), _def_line(fn))
    for role in ("seq", "dist"):
        if not callable(getattr(c, role)):
            raise InputError(f"case {name}: {role} must be a function, not "
                             f"{type(getattr(c, role)).__name__}", str(path), _def_line(fn))
    return c


def run_case(path: Path, name: str, fn: Callable[[], Case], engine: str = "auto",
             keep_facts: Path | None = None, reporter: Reporter = NULL_REPORTER,
             cache_dir: Path | None = None, rules_dir: Path | None = None,
             patterns: Sequence[Pattern] | None = None) -> CaseOutcome:
    """Build and verify one case. Bad input inside the case raises InputError,
    also when the user's seq or dist function fails while it is traced.
    `cache_dir`: the on-disk segment memo (dlverify/memo.py); off when None.
    `rules_dir`: another rule set (a folder with a main.dl); the installed one when None.
    `patterns`: the bug patterns matched on a failure (None: the shipped ones)."""
    from dlverify.api import verify_jax

    t0 = time.perf_counter()
    reporter.phase("build")
    c = build_case(path, name, fn)
    keep = keep_facts / name if keep_facts is not None else None
    try:
        res = verify_jax(c.seq, c.dist, *c.args, engine=engine, keep_facts=keep,  # type: ignore[arg-type]
                         name=name, reporter=reporter, cache_dir=cache_dir, rules_dir=rules_dir,
                         patterns=patterns)
    except InputError as e:
        if not e.file:  # nothing better known: point at the case
            e.file, e.line = str(path), _def_line(fn)
        raise
    except MemoryError:
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as e:
        _not_ours(e)
        line = _user_line(e, path)
        if not line and not isinstance(e, (SystemExit, KeyboardInterrupt)):
            raise  # it never ran the user's code: ours, an internal error
        raise InputError(f"case {name} failed while {reporter.current}: {_what(e)}", str(path),
                         line or _def_line(fn)) from None
    return CaseOutcome(name, str(path), c.expect, res, seconds=time.perf_counter() - t0)
