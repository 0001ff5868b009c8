"""What a zoo holds: entries read from a manifest (TOML) or from the paths and
globs of the command line.

A manifest lists three kinds of entries (paths relative to the manifest's folder):

    [defaults]                 # optional, for every entry below
    timeout = 300              # seconds per item
    max_memory = "4G"          # per item

    [[cases]]                  # a case file (or a folder, or a glob of them)
    path = "examples/megatron_mlp.py"
    name = "megatron_mlp_tp2"  # optional: one case of the file
    timeout = 60               # optional: overrides the default for these items

    [[hlo]]                    # an HLO pair, as `dlverify check`
    seq = "seq.hlo"
    dist = "dist.hlo"
    spec = "relations.toml"    # optional; also: ranks, custom_calls, name
    expect = "bug"             # optional: "verified" (the default) or "bug"

    [[dumps]]                  # an XLA dump folder, as `dlverify check-dump`
    path = "xla_dump/"         # also: custom_calls, expect, timeout, max_memory

On the command line, a `.toml` file is a manifest, `PATH.py` or `PATH.py::NAME`
a case file, a folder holding `*.before_optimizations.txt` files a dump folder,
any other folder its example files (the `.py` files under it, recursively, that
mention dlverify; hidden folders and `_*.py` left out), and a glob (`*`, `?`,
`[`, `**`) the files and folders it matches. Bad input raises InputError naming
the file and line.
"""
from __future__ import annotations

import glob
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from dlverify.errors import InputError

Expect = Literal["verified", "bug"]
GLOB_CHARS = re.compile(r"[*?\[]")
DUMP_MARKER = "*.before_optimizations.txt"


@dataclass(frozen=True)
class ItemLimits:
    """What one item may use; None: the command line's value (or no limit)."""

    seconds: float | None = None
    memory_bytes: int | None = None

    def over(self, base: "ItemLimits") -> "ItemLimits":
        """These limits, falling back on `base` where unset."""
        return ItemLimits(self.seconds if self.seconds is not None else base.seconds,
                          self.memory_bytes if self.memory_bytes is not None else base.memory_bytes)


@dataclass(frozen=True)
class CaseEntry:
    """A case file: every case, or the one named."""

    path: Path
    name: str | None = None
    limits: ItemLimits = ItemLimits()


@dataclass(frozen=True)
class HloEntry:
    """An HLO pair with its optional spec, verified as by `dlverify check`."""

    seq: Path
    dist: Path
    spec: Path | None = None
    ranks: int | None = None
    custom_calls: Path | None = None
    expect: Expect = "verified"
    name: str = ""
    limits: ItemLimits = ItemLimits()

    @property
    def label(self) -> str:
        return self.name or f"{self.seq.name} vs {self.dist.name}"

    @property
    def inputs(self) -> list[Path]:
        return [p for p in (self.seq, self.dist, self.spec, self.custom_calls) if p is not None]


@dataclass(frozen=True)
class DumpEntry:
    """An XLA dump folder, verified as by `dlverify check-dump`."""

    path: Path
    custom_calls: Path | None = None
    expect: Expect = "verified"
    limits: ItemLimits = ItemLimits()


Entry = CaseEntry | HloEntry | DumpEntry


# ---------------------------------------------------------------------------
# the command line

def entries_of(targets: list[str]) -> list[Entry]:
    """The entries the command line's targets name, in order, each once."""
    if not targets:
        raise InputError("nothing to verify: give a manifest (.toml), case files, folders or globs")
    out: list[Entry] = []
    for target in targets:
        path_text, _, name = target.partition("::")
        path = Path(path_text)
        if name:
            out.append(CaseEntry(_case_file(path), name))
        elif path.suffix == ".toml" and path.is_file():
            out += read_manifest(path)
        elif GLOB_CHARS.search(path_text) and not path.exists():
            out += _globbed(path_text, ItemLimits())
        elif path.is_dir():
            out += _folder(path, ItemLimits())
        else:
            out.append(CaseEntry(_case_file(path)))
    return _unique(out)


def _case_file(path: Path) -> Path:
    if not path.exists():
        raise InputError("no such file", str(path))
    if not path.is_file() or path.suffix != ".py":
        raise InputError("not a case file (expected PATH.py, PATH.py::NAME, a folder, a glob or "
                         "a manifest .toml)", str(path))
    return path


def _globbed(pattern: str, limits: ItemLimits, where: str = "", line: int = 0) -> list[Entry]:
    matches = sorted(glob.glob(pattern, recursive=True))
    if not matches:
        raise InputError(f"the glob {pattern!r} matches nothing", where or pattern, line)
    out: list[Entry] = []
    for m in matches:
        p = Path(m)
        if p.is_dir():
            out += _folder(p, limits, quiet=True)
        elif p.suffix == ".py":
            out.append(CaseEntry(p, None, limits))
    if not out:
        raise InputError(f"the glob {pattern!r} matches no case file or folder", where or pattern,
                         line)
    return out


def _folder(path: Path, limits: ItemLimits, quiet: bool = False) -> list[Entry]:
    """A dump folder, or the example files under a folder."""
    if any(path.glob(DUMP_MARKER)):
        return [DumpEntry(path, limits=limits)]
    files = [p for p in sorted(path.rglob("*.py")) if _is_example(p, path)]
    if not files and not quiet:
        raise InputError("no example files here (.py files that mention dlverify) and no XLA dump",
                         str(path))
    return [CaseEntry(p, None, limits) for p in files]


def _is_example(p: Path, root: Path) -> bool:
    parts = p.relative_to(root).parts
    if any(part.startswith(".") or part == "__pycache__" for part in parts) or p.name.startswith("_"):
        return False
    try:
        return "dlverify" in p.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _unique(entries: list[Entry]) -> list[Entry]:
    seen: set[Entry] = set()
    out = []
    for e in entries:
        if e not in seen:
            seen.add(e)
            out.append(e)
    return out


# ---------------------------------------------------------------------------
# the manifest

_SECTIONS = {"cases": ("path", "name", "timeout", "max_memory"),
             "hlo": ("seq", "dist", "spec", "ranks", "custom_calls", "expect", "name", "timeout",
                     "max_memory"),
             "dumps": ("path", "custom_calls", "expect", "timeout", "max_memory")}


@dataclass(frozen=True)
class _Where:
    """An entry's place in the manifest, for error messages."""

    file: str
    line: int
    what: str

    def error(self, message: str) -> InputError:
        return InputError(f"{self.what}: {message}", self.file, self.line)


def read_manifest(path: Path) -> list[Entry]:
    """The entries of a manifest, checked: every file named exists."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start})", str(path)) from None
    except OSError as e:
        raise InputError(f"cannot read the manifest: {e.strerror or e}", str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"at line (\d+)", str(e))
        raise InputError(f"not valid TOML: {str(e).split(' (at')[0]}", str(path),
                         int(m.group(1)) if m else 0) from None
    except RecursionError:
        raise InputError("nested too deeply", str(path)) from None
    unknown = sorted(set(data) - set(_SECTIONS) - {"defaults"})
    if unknown:
        raise InputError(f"unknown section {unknown[0]!r} (expected defaults, cases, hlo, dumps)",
                         str(path), _header_line(text, unknown[0], 0))
    defaults_where = _Where(str(path), _header_line(text, "defaults", 0), "[defaults]")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise defaults_where.error("expected a table")
    _known_keys(defaults, ("timeout", "max_memory"), defaults_where)
    base = _limits(defaults, defaults_where)
    out: list[Entry] = []
    for section in _SECTIONS:
        rows = data.get(section, [])
        if not isinstance(rows, list):
            raise InputError(f"{section}: expected [[{section}]] entries", str(path),
                             _header_line(text, section, 0))
        for i, row in enumerate(rows):
            where = _Where(str(path), _header_line(text, section, i), f"[[{section}]] entry {i + 1}")
            if not isinstance(row, dict):
                raise where.error("expected a table")
            _known_keys(row, _SECTIONS[section], where)
            out += _entry(section, row, path.parent, _limits(row, where).over(base), where)
    if not out:
        raise InputError("the manifest lists nothing to verify ([[cases]], [[hlo]] or [[dumps]])",
                         str(path))
    return out


def _header_line(text: str, section: str, index: int) -> int:
    """The line of the index-th `[[section]]` (or `[section]`) header."""
    pattern = re.compile(rf"^[ \t]*\[\[?[ \t]*{re.escape(section)}[ \t]*\]\]?", re.MULTILINE)
    for i, m in enumerate(pattern.finditer(text)):
        if i == index:
            return text.count("\n", 0, m.start()) + 1
    return 0


def _known_keys(row: dict, keys: tuple[str, ...], where: _Where) -> None:
    for key in row:
        if key not in keys:
            raise where.error(f"unknown key {key!r} (expected one of {', '.join(keys)})")


def _limits(row: dict, where: _Where) -> ItemLimits:
    from dlverify.supervise import check_seconds, parse_memory

    seconds, memory = row.get("timeout"), row.get("max_memory")
    try:
        if seconds is not None:
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                raise InputError(f"timeout {seconds!r}: expected a number of seconds")
            check_seconds(float(seconds), "timeout")
        if memory is not None and not isinstance(memory, str):
            raise InputError(f"max_memory {memory!r}: expected a size such as \"4G\"")
        return ItemLimits(float(seconds) if seconds is not None else None,
                          parse_memory(memory) if memory is not None else None)
    except InputError as e:
        raise where.error(e.message.replace("--max-memory", "max_memory")) from None


def _string(row: dict, key: str, where: _Where, required: bool = False) -> str | None:
    value = row.get(key)
    if value is None:
        if required:
            raise where.error(f"missing {key!r}")
        return None
    if not isinstance(value, str) or not value:
        raise where.error(f"{key} must be a non-empty string, not {value!r}")
    return value


def _file(row: dict, key: str, base: Path, where: _Where, required: bool = False) -> Path | None:
    text = _string(row, key, where, required)
    if text is None:
        return None
    p = base / text
    if not p.is_file():
        raise where.error(f"{key} {text!r}: {'not a file' if p.exists() else 'no such file'}")
    return p


def _expect(row: dict, where: _Where) -> Expect:
    value = row.get("expect", "verified")
    if value not in ("verified", "bug"):
        raise where.error(f"expect must be \"verified\" or \"bug\", not {value!r}")
    return value


def _entry(section: str, row: dict[str, Any], base: Path, limits: ItemLimits,
           where: _Where) -> list[Entry]:
    if section == "cases":
        text = _string(row, "path", where, required=True)
        assert text is not None
        name = _string(row, "name", where)
        p = base / text
        if GLOB_CHARS.search(text) and not p.exists():
            found = _globbed(str(p), limits, where.file, where.line)
        elif p.is_dir():
            found = [e for e in _folder(p, limits, quiet=True) if isinstance(e, CaseEntry)]
            if not found:
                raise where.error(f"path {text!r}: no example files in this folder")
        elif p.is_file() and p.suffix == ".py":
            found = [CaseEntry(p, None, limits)]
        else:
            raise where.error(f"path {text!r}: {'not a case file' if p.exists() else 'no such file'}")
        if name is not None:
            if len(found) != 1:
                raise where.error("name needs a path naming one case file")
            found = [replace(found[0], name=name)]
        return found
    if section == "hlo":
        ranks = row.get("ranks")
        if ranks is not None and (isinstance(ranks, bool) or not isinstance(ranks, int)
                                  or not 1 <= ranks <= 65536):
            raise where.error(f"ranks {ranks!r}: expected an integer in 1..65536")
        seq, dist = _file(row, "seq", base, where, True), _file(row, "dist", base, where, True)
        assert seq is not None and dist is not None
        return [HloEntry(seq, dist, _file(row, "spec", base, where), ranks,
                         _file(row, "custom_calls", base, where), _expect(row, where),
                         _string(row, "name", where) or "", limits)]
    text = _string(row, "path", where, required=True)
    assert text is not None
    p = base / text
    if not p.is_dir():
        raise where.error(f"path {text!r}: {'not a folder' if p.exists() else 'no such folder'}")
    return [DumpEntry(p, _file(row, "custom_calls", base, where), _expect(row, where), limits)]
