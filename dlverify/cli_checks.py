"""The checks the CLI makes before anything runs: every bad option is one line
naming the option (and file and line) and exit 2, before a case is imported."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from dlverify.errors import InputError


def engine_ok(engine: str) -> None:
    if engine not in ("auto", "clingo", "souffle"):
        raise InputError(f"unknown engine {engine!r}: use auto, clingo or souffle")


def writable_file(path: Optional[Path], option: str) -> None:
    """The file can be created or overwritten (tried, not guessed: root passes
    every permission test but still cannot write under /proc)."""
    if path is None:
        return
    if path.is_dir():
        raise InputError(f"{option}: is a directory, expected a file path", str(path))
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError(f"{option}: the folder {parent} does not exist", str(path))
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise InputError(f"{option}: cannot write here: {e.strerror or e}", str(path)) from None
    if not existed:
        try:
            path.unlink()
        except OSError:
            pass


def writable_dir(path: Optional[Path], option: str) -> None:
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise InputError(f"{option}: exists and is not a folder", str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".dlverify-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise InputError(f"{option}: cannot write here: {e.strerror or e}", str(path)) from None


def toml_ok(path: Optional[Path], option: str) -> None:
    """A spec or registry file is UTF-8 TOML: checked before the run, so that
    bytes that are not text or nesting deeper than the parser's recursion
    end as one line naming the file and line, whoever reads the file later."""
    if path is None:
        return
    if not path.is_file():
        raise InputError(f"{option}: {'not a file' if path.exists() else 'no such file'}",
                         str(path))
    import tomllib

    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{option}: not UTF-8 text (byte {e.start})", str(path),
                         data[: e.start].count(b"\n") + 1) from None
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", 0) or toml_error_line(str(e))
        raise InputError(f"{option}: not valid TOML: {str(e).split(' (at')[0]}", str(path),
                         line) from None
    except RecursionError:
        raise InputError(f"{option}: nested too deeply", str(path)) from None


def toml_error_line(message: str) -> int:
    import re
    m = re.search(r"at line (\d+)", message)
    return int(m.group(1)) if m else 0


def explain_ok(explain: Optional[str]) -> None:
    if explain is None:
        return
    name, _, rank = explain.partition("@")
    if not name or (rank and not rank.isdigit()) or ("@" in explain and not rank):
        raise InputError(f"--explain {explain!r}: expected OUTPUT or OUTPUT@RANK, e.g. out0 or "
                         "out0@1")


def check_common(engine: str, timeout: Optional[float], max_memory: Optional[str],
                  explain: Optional[str], outputs: dict[str, Optional[Path]],
                  keep_facts: Optional[Path] = None,
                  cache: Optional[Path] = None, rules: Optional[Path] = None) -> Optional[int]:
    """Validate what is shared (--rules: the rule set fits the schema); returns the memory limit in bytes."""
    from dlverify.rules.ruleset import checked_main
    from dlverify.supervise import check_seconds, parse_memory

    engine_ok(engine)
    check_seconds(timeout)
    memory = parse_memory(max_memory) if max_memory is not None else None
    explain_ok(explain)
    for option, path in outputs.items():
        writable_file(path, option)
    writable_dir(keep_facts, "--keep-facts")
    writable_dir(cache, "--cache")
    checked_main(rules)
    return memory


def pattern_set(files: Optional[list[Path]]) -> Optional[tuple]:
    """`--patterns FILE` (repeatable): the shipped bug patterns and those of the files,
    compiled here so that a bad file stops the run at once; None without the option
    (each child then uses the shipped ones)."""
    if not files:
        return None
    from dlverify.patterns import load_pattern_set
    return load_pattern_set(files)


def hlo_pair_ok(seq: Path, dist: Path, ranks: Optional[int], spec: Optional[Path],
                custom_calls: Optional[Path]) -> None:
    """The inputs every HLO-pair command takes: both modules readable files, the
    rank count in range, the spec and registry readable TOML."""
    if ranks is not None and not 1 <= ranks <= 65536:
        raise InputError(f"--ranks {ranks}: the supported range is 1..65536")
    for p in (seq, dist):
        if not p.is_file():
            raise InputError("cannot read HLO file: "
                             + ("not a file" if p.exists() else "no such file"), str(p))
    toml_ok(spec, "--spec")
    toml_ok(custom_calls, "--custom-calls")
