"""Content keys, the verdict cache and the resume journal of `dlverify zoo`.

An item's key hashes everything its verdict depends on that the run can see:
the contents of its input files (a case file, the HLO files, spec and
custom-call registry, every file of a dump folder), the case name and
expectation, the rule set (`memo.rules_hash`, as the segment memo keys it),
dlverify's version and the hash of its own source files (an editable install
keeps its version number across edits), the versions of JAX, jaxlib and
clingo, the engine and Python's version. Files a case reads at run time
(data, not imported modules) are not seen: --no-cache after changing them. A
cached entry also records the Python files the item imported from outside
the environment (helper modules of a case file) with their hashes: a hit
needs every one unchanged. Only verdicts are cached; an item that hit a
limit, crashed or had bad input runs again next time.

The resume journal keeps every finished item of a run (errors too) under the
run's key (its entries and the salt); `--resume` keeps them instead of running
them again. A run without --resume starts its journal afresh.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import shutil
import sys
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from dlverify.zoo.results import ItemResult

FORMAT = 1  # of the pickled entries; a change makes older entries misses
CODE_PACKAGES = ("dlverify", "dlverify.frontends", "dlverify.datalog")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dlverify" / "zoo"


def digest_bytes(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))  # framed: ("ab","c") != ("a","bc")
        h.update(data)
    return h.hexdigest()


def file_digest(path: Path) -> str:
    return digest_bytes(Path(path).read_bytes())


def folder_digest(path: Path) -> str:
    """Every file under `path`, by relative name and contents."""
    parts: list[bytes | str] = []
    for p in sorted(q for q in Path(path).rglob("*") if q.is_file()):
        parts += [str(p.relative_to(path)), p.read_bytes()]
    return digest_bytes(*parts)


@lru_cache(maxsize=1)
def code_roots() -> tuple[Path, ...]:
    """The folders of dlverify's own packages (the source of an editable install)."""
    roots = []
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            roots.append(Path(loc).resolve())
    return tuple(roots)


@cache
def salt(engine: str, rules_dir: Path | None = None) -> str:
    """Rule set (the installed one, or --rules), dlverify version and source, engine, Python:
    part of every key."""
    from dlverify.memo import rules_hash

    main_dl = Path(str(resources.files("dlverify.datalog").joinpath("main.dl"))) if rules_dir is None \
        else Path(rules_dir) / "main.dl"
    versions = []
    for dist in ("dlverify", "jax", "jaxlib", "clingo"):  # the frontends trace with JAX
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} unknown")
    code: list[bytes | str] = []
    for root in code_roots():
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".toml", ".json") and "__pycache__" not in p.parts:
                code += [str(p.relative_to(root)), p.read_bytes()]
    return digest_bytes(f"format {FORMAT}", rules_hash(main_dl), *versions, digest_bytes(*code),
                        engine, f"{sys.version_info[:2]}")


def outside_environment(path: Path) -> bool:
    """A file of the user's (not of Python, the installed packages or dlverify)."""
    p = path.resolve()
    env = {Path(x).resolve() for x in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return not any(p.is_relative_to(root) for root in (*env, *code_roots()))


def deps_unchanged(deps: dict[str, str]) -> bool:
    for path, want in deps.items():
        try:
            if file_digest(Path(path)) != want:
                return False
        except OSError:
            return False
    return True


@dataclass
class Entry:
    """What the cache keeps under a key."""

    value: Any                   # list[ItemResult], or a case file's case names
    deps: dict[str, str] = field(default_factory=dict)  # imported file -> its digest


class _Store:
    """Pickled entries under a folder, one file per key, written atomically."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pkl"

    def get(self, key: str) -> Entry | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - a torn or foreign file is a miss, recomputed
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
            return None
        entry = data.get("entry")
        return entry if isinstance(entry, Entry) else None

    def put(self, key: str, entry: Entry) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{id(entry)}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump({"format": FORMAT, "key": key, "entry": entry}, f)
        os.replace(tmp, path)  # atomic: a reader never sees half an entry


class ZooCache:
    """Verdicts and case lists by content key. Disabled: every lookup misses,
    nothing is written."""

    def __init__(self, root: Path, enabled: bool = True) -> None:
        self.enabled = enabled
        self._store = _Store(root / "items")

    def get(self, key: str) -> Entry | None:
        if not self.enabled:
            return None
        entry = self._store.get(key)
        if entry is None or not deps_unchanged(entry.deps):
            return None
        return entry

    def put(self, key: str, entry: Entry) -> None:
        if self.enabled:
            self._store.put(key, entry)


class Journal:
    """The finished items of one run (keyed by the run's entries), errors included."""

    def __init__(self, root: Path, run_key: str, resume: bool) -> None:
        self.folder = root / "runs" / run_key
        if not resume and self.folder.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
        self.resume = resume
        self._store = _Store(self.folder)

    def get(self, key: str) -> list[ItemResult] | None:
        if not self.resume:
            return None
        entry = self._store.get(key)
        if entry is None or not deps_unchanged(entry.deps):
            return None
        return entry.value

    def put(self, key: str, results: list[ItemResult], deps: dict[str, str]) -> None:
        self._store.put(key, Entry(results, deps))
