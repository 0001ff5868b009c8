"""Memoised segment runs: a segment's facts and incoming views (padded views
too) with ids renamed canonically, hashed; a segment seen before reuses its
derived views and padded views.

Why this is sound: the rules compare tensor ids, op ids, value ids and op
signatures only for equality (no arithmetic, no ordering, no id constants), so
the fixpoint commutes with any injective renaming of them. Two segments whose
renamed inputs are equal, row for row, therefore derive the same views up to
that renaming. The key is the whole engine input (every row of every relation,
seeds included), never a summary of it. The order in which ids are renamed
(ops in program order, then their operands and result) only decides how often
equal segments are recognised, not whether a hit is correct.

The on-disk cache (`cache_dir`) keys results by the content hash, the hash of
the rule files, dlverify's version and the engine, so a changed rule set or
release never reads stale results.
"""
from __future__ import annotations

import hashlib
import json
import marshal
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Callable, Collection

from dlverify import schema as S

ViewRow = tuple  # (s, d, r, offsets-record, tag-record | None, scale-record)
PadRow = tuple  # (s, d, r, offsets-record, z): a Pad_View row (datalog/padded.dl)
ID_TYPES = frozenset({"OpId", "TensorId"})
MARSHAL_VERSION = 2  # the key's serialisation: version 2 writes no back-references, so equal rows
# give equal bytes whatever objects they share (from 3 on, rows read back from the
# on-disk cache serialised differently from the engine's and later segments missed)
# Relations whose ValueId columns are named first (by the tensor they describe),
# so interned values get canonical names in a canonical order.
VALUE_FIRST = (S.SEQ_SPLAT, S.DIST_SPLAT)
# Columns holding an op signature (Op_Sig's numbering of kinds and params), by
# relation name: renamed by one namer, Op_Sig's first, so a row about a signature
# (Sig_Zero: ops of signature g map zeros to zero) keeps naming the same ops. Left
# as plain numbers, a renamed Op_Sig could meet another signature's row: unsound.
SIG_COLUMNS: dict[str, str] = {"Op_Sig": "sig", "Sig_Zero": "g"}


@dataclass
class Canonical:
    """One segment's engine input in canonical ids, and the way back."""

    tables: dict[S.Relation, list[tuple]]
    key: str
    back: list[int]  # canonical id -> original op or tensor id (index 0 unused)


class _Namer(dict):
    """Original id -> canonical id, numbered from 1 in order of first lookup
    (`namer[x]`: a dict lookup, the common case, runs at C speed)."""

    def __init__(self) -> None:
        super().__init__()
        self.back: list[int] = [0]

    def __missing__(self, x: int) -> int:
        y = self[x] = len(self.back)
        self.back.append(x)
        return y

    def __call__(self, x: int) -> int:
        return self[x]


@lru_cache(maxsize=None)
def _renamer(arity: int, cols: tuple[int, ...]) -> Callable[[tuple, _Namer], tuple]:
    """A function renaming columns `cols` of a row of `arity` columns (generated
    once per shape: the generic loop over columns dominated a segment's cost)."""
    parts = ", ".join(f"g[r[{i}]]" if i in cols else f"r[{i}]" for i in range(arity))
    return eval(f"lambda r, g: ({parts},)")  # noqa: S307 - built from integers only


@lru_cache(maxsize=None)
def _other_columns(arity: int, masked: tuple[int, ...]) -> Callable[[list], object]:
    """Sort key of a row by its columns outside `masked` (a C-level itemgetter: the
    same order as comparing whole rows with the masked columns blanked)."""
    rest = [i for i in range(arity) if i not in masked]
    if not rest:
        return lambda row: 0
    return itemgetter(*rest)


# A Seed row from (id, s, d, r, red, op, axis, lo, hi, e2, e3, e5, e7), in the
# relation's column order (what S.seed_row builds, without its per-row checks:
# segments of a training step carry 10^5 seeds; tests/test_memo.py compares the two).
_SEED_FIELDS = ("id", "s", "d", "r", "red", "op", "axis", "lo", "hi", "e2", "e3", "e5", "e7")
assert sorted(_SEED_FIELDS) == sorted(c.name for c in S.SEED.columns), "Seed's columns changed"
_seed_row = itemgetter(*(_SEED_FIELDS.index(c.name) for c in S.SEED.columns))


def offsets_record(offs: tuple[int, ...] | list[int]) -> object:
    rec: object = None
    for o in reversed(offs):
        rec = (o, rec)
    return rec


def record_offsets(rec: object) -> list[int]:
    out = []
    while rec is not None:
        h, rec = rec  # type: ignore[misc]
        out.append(h)
    return out


def canonicalise(order: list[int], tables: dict[S.Relation, list[tuple]],
                 seeds: set[ViewRow], pad_seeds: Collection[PadRow] = ()) -> Canonical:
    """Rename the ids of a segment: `order` lists op and tensor ids in canonical order
    (each op, its operands, its result, ops in program order); seeds become Seed rows,
    padded seeds Pad_Seed rows (named after the seeds, the same way)."""
    ids = _Namer()
    name = ids.__getitem__  # (names a new id on a miss: _Namer.__missing__)
    for x in order:
        name(x)
    # Seeds: tensors are named by the ops that read them; tag ops (reductions of
    # earlier segments) in the order of the renamed seeds. Each seed's offsets,
    # tag (its op left out) and scale are read once.
    named = ids.get
    items = [(v, tuple(record_offsets(v[3])),
              (-1, 0, 0, 0, 0) if v[4] is None else (v[4][0], -1, v[4][2], v[4][3], v[4][4]),
              tuple(v[5])) for v in seeds]

    def seed_key(item: tuple) -> tuple:
        v, offs, tag, c = item
        # a tensor the window does not read is not named yet: key it by its
        # partner and the view alone (never by its own id, which is arbitrary)
        return (named(v[0], 0), named(v[1], 0), v[2], offs, tag, c)

    # Ties (seeds of tensors not named yet, equal views) go by id, not by a set's
    # order: tuples holding None hash by address, so that order changes between
    # processes and the on-disk cache missed; ids keep their order across equal layers.
    items.sort(key=lambda it: (seed_key(it), it[0][0], it[0][1]))
    for it in items:  # then name those tensors in that order
        name(it[0][0])
        name(it[0][1])
    items.sort(key=seed_key)
    out: dict[S.Relation, list[tuple]] = {}
    seed_rows, off_rows = [], []
    for sid, ((s, d, r, _, p, _), offs, _, c) in enumerate(items, start=1):
        tag = (-1, 0, 0, 0, 0) if p is None else (p[0], name(p[1]), p[2], p[3], p[4])
        seed_rows.append(_seed_row((sid, name(s), name(d), r, *tag, *c)))
        off_rows.extend((sid, i, off) for i, off in enumerate(offs))
    if seed_rows:
        out[S.SEED] = seed_rows
        out[S.SEED_OFF] = off_rows
    if pad_seeds:
        out.update(_pad_seed_rows(ids, pad_seeds))

    values, sigs = _Namer(), _Namer()
    first = VALUE_FIRST + (S.OP_SIG,)
    rels = list(first) + [r for r in tables if r not in first]
    for rel in rels:
        rows = tables.get(rel)
        if not rows:
            continue
        id_cols = [i for i, c in enumerate(rel.columns) if c.type in ID_TYPES]
        val_cols = [i for i, c in enumerate(rel.columns) if c.type == "ValueId"]
        sig_cols = [i for i, c in enumerate(rel.columns) if SIG_COLUMNS.get(rel.name) == c.name]
        masked = val_cols + sig_cols

        rename = _renamer(rel.arity, tuple(id_cols))
        if not masked:
            # Rows of tensors that only seeds name (not read by the window) arrive
            # in no canonical order: sort every relation.
            out[rel] = sorted(map(rename, rows, repeat(ids)))
            continue
        # Name values and signatures in the order of the rows' other columns.
        renamed = list(map(list, map(rename, rows, repeat(ids))))
        renamed.sort(key=_other_columns(rel.arity, tuple(masked)))
        value, sig = values.__getitem__, sigs.__getitem__
        for row in renamed:
            for i in val_cols:
                row[i] = value(row[i])
            for i in sig_cols:
                row[i] = sig(row[i])
        out[rel] = sorted(tuple(row) for row in renamed)
    h = hashlib.sha256()
    for rel in sorted(out, key=lambda r: r.name):
        h.update(rel.name.encode())
        h.update(marshal.dumps(out[rel], MARSHAL_VERSION))
    return Canonical(out, h.hexdigest(), ids.back)


def _pad_seed_rows(ids: _Namer, pad_seeds: Collection[PadRow]) -> dict[S.Relation, list[tuple]]:
    """Pad_Seed and Pad_Seed_Off rows of the padded seeds, their tensors named as the
    view seeds' are: by the window's names, ties by id (the padding value z is part
    of every row, so seeds differing only in z give different keys)."""
    named = ids.get
    items = [(v, tuple(record_offsets(v[3]))) for v in pad_seeds]

    def key(item: tuple) -> tuple:
        (s, d, r, _, z), offs = item
        return (named(s, 0), named(d, 0), r, offs, z)

    items.sort(key=lambda it: (key(it), it[0][0], it[0][1]))
    for (s, d, *_), _ in items:  # then name those tensors in that order
        ids(s)
        ids(d)
    items.sort(key=key)
    seed_rows, off_rows = [], []
    for sid, ((s, d, r, _, z), offs) in enumerate(items, start=1):
        seed_rows.append(S.PAD_SEED.row(id=sid, s=ids[s], d=ids[d], r=r, z=z))
        off_rows.extend(S.PAD_SEED_OFF.row(id=sid, i=i, off=o) for i, o in enumerate(offs))
    return {S.PAD_SEED: seed_rows, S.PAD_SEED_OFF: off_rows}


def pad_views_back(canon: Canonical, rows: list[tuple]) -> list[PadRow]:
    """Derived Pad_View rows of a canonical run, in the segment's own ids."""
    b = canon.back
    col = S.PAD_VIEW.column_index
    s_, d_, r_, o_, z_ = (col(n) for n in ("s", "d", "r", "o", "z"))
    return [(b[row[s_]], b[row[d_]], row[r_], row[o_], row[z_]) for row in rows]


def pad_seed_views(tables: dict[S.Relation, list[tuple]]) -> list[PadRow]:
    """Pad_View rows of the Pad_Seed rows among the input relations (the engine
    builds them the same way, datalog/padded.dl)."""
    col = S.PAD_SEED.column_index
    offs: dict[int, dict[int, int]] = defaultdict(dict)
    for sid, i, o in tables.get(S.PAD_SEED_OFF, []):
        offs[sid][i] = o
    out = []
    for row in tables.get(S.PAD_SEED, []):
        sid = row[col("id")]
        o = tuple(offs[sid][i] for i in range(len(offs[sid])))
        out.append((row[col("s")], row[col("d")], row[col("r")], offsets_record(o), row[col("z")]))
    return out


def views_back(canon: Canonical, rows: list[tuple]) -> list[ViewRow]:
    """Derived View rows of a canonical run, in the segment's own ids."""
    b = canon.back
    out = []
    for s, d, r, o, p, c in rows:
        tag = None if p is None else (p[0], b[p[1]], p[2], p[3], p[4])
        out.append((b[s], b[d], r, o, tag, tuple(c)))
    return out


def rules_hash(main_dl: Path) -> str:
    """A hash of every rule file next to `main_dl`."""
    h = hashlib.sha256()
    for path in sorted(Path(main_dl).parent.glob("*.dl")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _version() -> str:
    try:
        return metadata.version("dlverify")
    except metadata.PackageNotFoundError:
        return "unknown"


def _tuplify(x: object) -> object:
    if isinstance(x, list):
        return tuple(_tuplify(v) for v in x)
    return x


@dataclass(frozen=True)
class Derived:
    """What one segment derives: View rows and Pad_View rows, in canonical ids."""

    views: list[tuple]
    padded: list[tuple]


@dataclass
class Memo:
    """Derived views and padded views per canonical segment, in memory and optionally
    on disk."""

    main_dl: Path
    engine: str
    cache_dir: Path | None = None
    hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    _mem: dict[str, Derived] = field(default_factory=dict)
    _salt: str = ""

    def __post_init__(self) -> None:
        if self.cache_dir is not None:
            self.cache_dir = Path(self.cache_dir)
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self._salt = (f"{rules_hash(self.main_dl)}:{_version()}:{self.engine}:"
                          f"{sys.version_info[:2]}")

    def _path(self, key: str) -> Path:
        assert self.cache_dir is not None
        name = hashlib.sha256(f"{self._salt}:{key}".encode()).hexdigest()
        return self.cache_dir / name[:2] / f"{name}.json"

    def get(self, key: str) -> Derived | None:
        got = self._mem.get(key)
        if got is not None:
            self.hits += 1
            return got
        if self.cache_dir is not None:
            path = self._path(key)
            if path.is_file():
                try:
                    data = json.loads(path.read_text())
                except (OSError, ValueError):
                    data = None  # a torn or foreign file: recompute
                # (a file without "padded" predates padded seeds: recompute)
                if isinstance(data, dict) and data.get("key") == key and "padded" in data:
                    got = Derived(*([tuple(_tuplify(v) for v in row) for row in data[part]]
                                    for part in ("views", "padded")))
                    self._mem[key] = got
                    self.hits += 1
                    self.disk_hits += 1
                    return got
        self.misses += 1
        return None

    def put(self, key: str, got: Derived) -> None:
        self._mem[key] = got
        if self.cache_dir is not None:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": key, "views": got.views, "padded": got.padded}))
            os.replace(tmp, path)  # atomic: readers never see half a file
