"""Readers of HLO attribute values: integer lists, replica groups (explicit,
iota and mesh-axes forms), shardings, and constant literals. Attribute values
arrive as raw text (frontends/hlo/model.py); every reader raises ValueError on
malformed text (the caller names the instruction) except `parse_literal`,
which raises the InputError itself. Device lists are bounded by MAX_RANKS so a
hostile `[99999999999]<=[...]` is an error, not an allocation."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from dlverify.errors import InputError
from dlverify.frontends.hlo.model import (MAX_RANKS, MAX_TUPLE_DEPTH, HloInstruction, HloShape,
                                          np_dtype)
from dlverify.frontends.hlo.text import split_top, string_end, unescape
from dlverify.relations import BlockRelation


def _device_count(sizes: list[int], what: str) -> int:
    """The product of `sizes`, refused beyond MAX_RANKS before anything is allocated."""
    total = 1
    for s in sizes:
        total *= s
        if total > MAX_RANKS:
            raise ValueError(f"{what} spans more than {MAX_RANKS} devices (the supported maximum)")
    return total


_META_KEY = re.compile(r"(\w+)=")
_META_BARE = re.compile(r"[^\s}]+")


def parse_metadata(md: str) -> dict[str, str]:
    """`op_name="..." source_file="..." source_line=3` -> {key: value}, string
    values unescaped. One pass from key to key: linear time and memory in the
    length of the text (metadata strings can be megabytes long)."""
    out: dict[str, str] = {}
    i = 0
    while True:
        m = _META_KEY.search(md, i)
        if m is None:
            return out
        j = m.end()
        if md.startswith('"', j):
            end = string_end(md, j + 1)
            if end < 0:
                return out  # an unterminated string: nothing more to read
            out[m.group(1)] = unescape(md[j + 1:end])
            i = end + 1
            continue
        bare = _META_BARE.match(md, j)
        if bare is None:
            i = j
            continue
        out[m.group(1)] = bare.group()
        i = bare.end()


def ints(s: str | None) -> tuple[int, ...]:
    if s is None:
        return ()
    return tuple(int(x) for x in re.findall(r"-?\d+", s))


def parse_window(spec: str | None, rank: int) -> dict[str, list]:
    """A `window={size=.. stride=.. pad=lo_hi.. lhs_dilate=.. rhs_dilate=..
    rhs_reversal=..}` attribute (reduce-window, convolution), one entry per dim,
    with XLA's defaults for what it omits."""
    text = (spec or "").strip().strip("{}")
    win: dict[str, list] = {"size": [1] * rank, "stride": [1] * rank, "pad": [(0, 0)] * rank,
                            "lhs_dilate": [1] * rank, "rhs_dilate": [1] * rank,
                            "rhs_reversal": [0] * rank}
    for part in text.split():
        key, _, val = part.partition("=")
        if key not in win:
            raise ValueError(f"unknown window attribute {key!r}")
        dims = val.split("x")
        if len(dims) != rank:
            raise ValueError(f"window {key}={val} does not give one entry per dim of rank {rank}")
        if key == "pad":
            win[key] = [tuple(int(x) for x in d.split("_")) for d in dims]
            if any(len(p) != 2 for p in win[key]):
                raise ValueError(f"bad window pad={val}")
        else:
            win[key] = [int(d) for d in dims]
    return win


def _iota_devices(dims: list[int], reshape: list[int], perm: list[int] | None) -> np.ndarray:
    total = _device_count(reshape, "iota device list")
    arr = np.arange(total).reshape(reshape)
    if perm:
        arr = arr.transpose(perm)
    return arr.reshape(dims)


def parse_iota_list(s: str) -> np.ndarray | None:
    """`[2,4]<=[4,2]T(1,0)` -> arange(8).reshape(4,2).transpose(1,0).reshape(2,4)."""
    m = re.fullmatch(r"\s*\[([\d,\s]*)\]\s*<=\s*\[([\d,\s]*)\]\s*(?:T\(([\d,\s]*)\))?\s*", s)
    if m is None:
        return None
    dims = list(ints(m.group(1)))
    reshape = list(ints(m.group(2)))
    perm = list(ints(m.group(3))) if m.group(3) is not None else None
    if _device_count(dims, "iota device list") != _device_count(reshape, "iota device list"):
        raise ValueError(f"iota list {s.strip()}: {dims} and {reshape} hold different counts")
    return _iota_devices(dims, reshape, perm)


def _mesh_groups(s: str) -> list[list[int]]:
    """The mesh-axes form: `mesh['a'=4,'b'=2][, device_ids=(...)] {'a'}` (also
    `@mesh<a=4,b=2>`), with sub-axes `'a':(pre)size`. A group is the set of devices
    that agree on every mesh (sub-)axis not listed; members are ordered row-major
    over the listed axes in the given order, groups row-major over the rest."""
    m = re.match(r"\s*(?:mesh\[(.*?)\]|@mesh<(.*?)>)", s)
    if m is None:
        raise ValueError(f"cannot read replica groups {s!r}")
    axes_txt = m.group(1) if m.group(1) is not None else m.group(2)
    names, sizes = [], []
    for item in split_top(axes_txt):
        am = re.fullmatch(r"'?([^'=]+)'?\s*=\s*(\d+)", item.strip())
        if am is None:
            raise ValueError(f"bad mesh axis {item!r}")
        names.append(am.group(1).strip())
        sizes.append(int(am.group(2)))
    total = _device_count(sizes, "mesh")
    rest = s[m.end():]
    devices = np.arange(total)
    dm = re.match(r"\s*,\s*device_ids=\((.*?)\)\s*(?=\{)", rest)
    if dm is not None:
        dtxt = dm.group(1).strip()
        im = re.fullmatch(r"\[([\d,\s]*)\]\s*(?:T\(([\d,\s]*)\))?", dtxt)
        if im is not None:
            reshape = list(ints(im.group(1)))
            perm = list(ints(im.group(2))) if im.group(2) is not None else None
            devices = _iota_devices([total], reshape, perm)
        else:
            devices = np.array(ints(dtxt))
        if devices.size != total:
            raise ValueError(f"device_ids of {s!r} list {devices.size} devices for a mesh of {total}")
        rest = rest[dm.end():]
    am = re.match(r"\s*\{(.*)\}\s*$", rest)
    if am is None:
        raise ValueError(f"no axes list in replica groups {s!r}")
    refs = []  # (axis index, pre, size)
    for item in split_top(am.group(1)):
        rm = re.fullmatch(r"'?([^':]+)'?\s*(?::\s*\((\d+)\)\s*(\d+))?", item.strip())
        if rm is None or rm.group(1).strip() not in names:
            raise ValueError(f"bad mesh axis reference {item!r} in {s!r}")
        ax = names.index(rm.group(1).strip())
        if rm.group(2) is not None:
            pre, size = int(rm.group(2)), int(rm.group(3))
            if sizes[ax] % (pre * size):
                raise ValueError(f"sub-axis {item!r}: ({pre}){size} does not divide axis size "
                                 f"{sizes[ax]}")
        else:
            pre, size = 1, sizes[ax]
        refs.append((ax, pre, size))
    # Refine every axis into pieces at all the sub-axis boundaries.
    pieces: list[list[int]] = []  # per axis: boundary products (major to minor)
    for ax, n in enumerate(sizes):
        cuts = {1, n}
        for a, pre, size in refs:
            if a == ax:
                cuts |= {pre, pre * size}
        cuts_s = sorted(cuts)
        for a in range(len(cuts_s) - 1):
            if cuts_s[a + 1] % cuts_s[a]:
                raise ValueError(f"overlapping sub-axes of {names[ax]!r} in {s!r}")
        pieces.append(cuts_s)
    fine_shape, fine_index = [], {}  # (axis, cut_lo) -> fine dim
    for ax, cuts in enumerate(pieces):
        for lo, hi in zip(cuts, cuts[1:]):
            fine_index[(ax, lo)] = len(fine_shape)
            fine_shape.append(hi // lo)
    grid = devices.reshape(fine_shape if fine_shape else [1])
    group_dims: list[int] = []
    for ax, pre, size in refs:
        cuts = pieces[ax]
        lo = pre
        while lo < pre * size:
            d = fine_index[(ax, lo)]
            if d in group_dims:
                raise ValueError(f"axis {names[ax]!r} listed twice in {s!r}")
            group_dims.append(d)
            lo = lo * fine_shape[d]
    other = [d for d in range(len(fine_shape)) if d not in group_dims]
    arr = grid.transpose(other + group_dims)
    gsize = int(np.prod([fine_shape[d] for d in group_dims])) if group_dims else 1
    return arr.reshape(-1, gsize).tolist()


def parse_replica_groups(s: str | None) -> list[list[int]] | None:
    """All three printed forms; None for `{}` (one group of every rank)."""
    if s is None:
        return None
    t = s.strip()
    if t.startswith("{"):
        inner = t[1:-1].strip()
        if not inner:
            return None
        groups = []
        for g in split_top(inner):
            g = g.strip()
            if not (g.startswith("{") and g.endswith("}")):
                raise ValueError(f"bad replica group {g!r}")
            groups.append(list(ints(g)))
        return groups
    if t.startswith("["):
        arr = parse_iota_list(t)
        if arr is None:
            raise ValueError(f"bad iota replica groups {t!r}")
        return arr.reshape(arr.shape[0], -1).tolist()
    if t.startswith("mesh[") or t.startswith("@mesh<"):
        return _mesh_groups(t)
    raise ValueError(f"unknown replica group format {t!r}")


@dataclass(frozen=True)
class HloSharding:
    """A parsed `sharding={...}`. kind: replicated | maximal | tiled | manual |
    unknown | tuple. For tiled: `tile_dims` per data dim and `devices`, the tile
    assignment of shape tile_dims + replication dims."""

    kind: str
    text: str
    tile_dims: tuple[int, ...] = ()
    devices: np.ndarray | None = None
    device: int | None = None
    manual_subgroup: bool = False
    elements: tuple["HloSharding", ...] = ()

    def relation(self, shape: tuple[int, ...], local: bool, ranks: int | None = None
                 ) -> BlockRelation | None:
        """The block each device holds: `shape` is the per-device shape if `local`
        (a partitioned module), else the global shape. None when the sharding is
        not a set of even blocks over devices 0..N-1."""
        shape = tuple(shape)
        if self.kind == "replicated":
            if ranks is None:
                return None
            return BlockRelation(shape, shape, tuple((0,) * len(shape) for _ in range(ranks)))
        if self.kind != "tiled" or self.devices is None or self.manual_subgroup:
            return None
        if len(self.tile_dims) != len(shape):
            return None
        if local:
            loc = shape
            glob = tuple(s * t for s, t in zip(shape, self.tile_dims))
        else:
            glob = shape
            if any(s % t for s, t in zip(shape, self.tile_dims)):
                return None
            loc = tuple(s // t for s, t in zip(shape, self.tile_dims))
        n = int(self.devices.size)
        if ranks is not None and ranks != n:
            return None
        if sorted(self.devices.reshape(-1).tolist()) != list(range(n)):
            return None
        offsets: list[tuple[int, ...] | None] = [None] * n
        for idx in np.ndindex(*self.devices.shape):
            d = int(self.devices[idx])
            offsets[d] = tuple(int(i) * l for i, l in zip(idx[:len(loc)], loc))
        return BlockRelation(glob, loc, tuple(offsets))  # type: ignore[arg-type]


def parse_sharding(s: str, depth: int = 0) -> HloSharding:
    """A `sharding={...}` value; tuple shardings nest at most MAX_TUPLE_DEPTH deep."""
    t = s.strip()
    if t.startswith("{") and t.endswith("}"):
        t = t[1:-1].strip()
    if t.startswith("{"):
        if depth >= MAX_TUPLE_DEPTH:
            raise ValueError(f"tuple sharding nested deeper than {MAX_TUPLE_DEPTH} levels")
        return HloSharding("tuple", s, elements=tuple(parse_sharding(e, depth + 1)
                                                      for e in split_top(t)))
    t = re.sub(r"\s*metadata=\{.*\}\s*$", "", t)
    if t == "replicated" or t.startswith("replicated "):
        return HloSharding("replicated", s)
    if t.startswith("maximal"):
        m = re.search(r"device=(\d+)", t)
        return HloSharding("maximal", s, device=int(m.group(1)) if m else None)
    if t.startswith("manual"):
        return HloSharding("manual", s)
    if t.startswith("unknown"):
        return HloSharding("unknown", s)
    m = re.match(r"devices=\[([\d,\s]*)\]\s*(.*)$", t)
    if m is None:
        raise ValueError(f"cannot read sharding {s!r}")
    dims = list(ints(m.group(1)))
    _device_count(dims, f"sharding {s!r}")
    rest = m.group(2).strip()
    im = re.match(r"(<=\s*\[[\d,\s]*\]\s*(?:T\([\d,\s]*\))?)(.*)$", rest)
    if im is not None:
        arr = parse_iota_list(f"[{','.join(map(str, dims))}]{im.group(1)}")
        assert arr is not None
        rest = im.group(2).strip()
    else:
        lm = re.match(r"([\d,\s]+)(.*)$", rest)
        if lm is None:
            raise ValueError(f"cannot read the devices of sharding {s!r}")
        ids = [int(x) for x in lm.group(1).replace(" ", "").split(",") if x]
        if len(ids) != int(np.prod(dims)):
            raise ValueError(f"sharding {s!r} lists {len(ids)} devices for tiles {dims}")
        arr = np.array(ids).reshape(dims)
        rest = lm.group(2).strip()
    n_data = len(dims)
    manual = False
    if "last_tile_dim_replicate" in rest:
        n_data -= 1
    lm = re.search(r"last_tile_dims=\{([^}]*)\}", rest)
    if lm is not None:
        kinds = [k.strip() for k in lm.group(1).split(",") if k.strip()]
        n_data -= len(kinds)
        manual = any(k == "manual" for k in kinds)
    return HloSharding("tiled", s, tuple(dims[:n_data]), arr, manual_subgroup=manual)


def parse_literal(raw: str, shape: HloShape, ins: HloInstruction, file: str) -> np.ndarray | None:
    t = raw.strip()
    if "..." in t:
        return None  # elided: unknown value, never zeros
    t = re.sub(r"^[a-z][a-z0-9]*\[[^\]]*\](\{[^}]*\})?\s*", "", t)  # old printers: shape first
    dt = np_dtype(shape.dtype)
    toks = re.findall(r"[^\s{},()]+", t)
    vals: list[Any] = []
    for tok in toks:
        low = tok.lower()
        if low in ("true", "false"):
            vals.append(low == "true")
        elif low in ("inf", "+inf", "-inf", "nan", "-nan", "+nan"):
            vals.append(float(low.replace("+", "")))
        else:
            try:
                is_int = re.fullmatch(r"[-+]?(0x[0-9a-fA-F]+|\d+)", tok)
                vals.append(int(tok, 0) if is_int else float(tok))
            except ValueError:
                raise InputError(f"constant {ins.name}: cannot read literal value {tok!r}", file,
                                 ins.line) from None
    count = int(np.prod(shape.dims)) if shape.dims else 1
    if shape.dtype.startswith("complex"):
        if len(vals) != 2 * count:
            raise InputError(f"constant {ins.name}: {len(vals)} numbers for {count} complex values",
                             file, ins.line)
        arr = np.array([complex(a, b) for a, b in zip(vals[::2], vals[1::2])], dtype=dt)
    else:
        if len(vals) != count:
            raise InputError(f"constant {ins.name}: literal has {len(vals)} values but the shape "
                             f"{shape} holds {count}", file, ins.line)
        if np.issubdtype(dt, np.integer):   # numpy would raise or wrap: the file is wrong
            info = np.iinfo(dt)
            bad = next((v for v in vals if isinstance(v, int) and not info.min <= v <= info.max),
                       None)
            if bad is not None:
                raise InputError(f"constant {ins.name}: literal value {bad} is out of range for "
                                 f"{shape.dtype} [{info.min}, {info.max}]", file, ins.line)
        arr = np.array(vals, dtype=dt)
    return arr.reshape(shape.dims)

