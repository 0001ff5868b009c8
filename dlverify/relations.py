"""Input and output relations at the program boundary.

A `BlockRelation` says, for every rank, which block of a sequential tensor the
distributed tensor holds: offsets per dim, the block's sizes being the
distributed tensor's shape. Replicated is the block at offset 0 of full size.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dlverify.errors import InputError
from dlverify.ir import Mesh

# One entry of a PartitionSpec: None (replicated), an axis name, or a tuple of
# axis names (the dim split over several mesh axes, major to minor).
SpecEntry = None | str | tuple[str, ...]


@dataclass(frozen=True)
class BlockRelation:
    seq_shape: tuple[int, ...]
    dist_shape: tuple[int, ...]
    offsets: tuple[tuple[int, ...], ...]  # indexed by rank

    def is_replicated(self) -> bool:
        return self.seq_shape == self.dist_shape


def spec_entries(spec: Any) -> tuple[SpecEntry, ...]:
    """The entries of a PartitionSpec-like `spec` (None: no entries, all replicated)."""
    return tuple(spec) if spec is not None else ()


def axes_of(entry: SpecEntry) -> tuple[str, ...]:
    """The mesh axes one spec entry shards its dim over (None: none)."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def spec_relation(global_shape: Sequence[int], spec: Sequence[SpecEntry], mesh: Mesh,
                  what: str) -> BlockRelation:
    """The block each rank holds under a PartitionSpec-like `spec` on `mesh`."""
    global_shape = tuple(int(s) for s in global_shape)
    entries = list(spec) + [None] * (len(global_shape) - len(spec))
    if len(entries) > len(global_shape):
        raise InputError(f"{what}: partition spec {tuple(spec)} has more entries than the "
                         f"rank-{len(global_shape)} shape {global_shape}")
    local = []
    for dim, (size, entry) in enumerate(zip(global_shape, entries)):
        axes = axes_of(entry)
        for a in axes:
            if a not in mesh.axis_names:
                raise InputError(f"{what}: partition spec names mesh axis {a!r}, "
                                 f"not one of {mesh.axis_names}")
        n = int(np.prod([mesh.axis_size(a) for a in axes])) if axes else 1
        if size % n:
            raise InputError(f"{what}: dim {dim} of size {size} does not split evenly over "
                             f"{n} shards ({'x'.join(axes)})")
        local.append(size // n)
    offsets = []
    for r in range(mesh.size):
        coords = mesh.coords(r)
        offs = []
        for size, entry, loc in zip(global_shape, entries, local):
            axes = axes_of(entry)
            idx = 0
            for a in axes:
                idx = idx * mesh.axis_size(a) + coords[a]
            offs.append(idx * loc)
        offsets.append(tuple(offs))
    return BlockRelation(global_shape, tuple(local), tuple(offsets))


def replicated(shape: Sequence[int], ranks: int) -> BlockRelation:
    shape = tuple(int(s) for s in shape)
    return BlockRelation(shape, shape, tuple((0,) * len(shape) for _ in range(ranks)))


def even_split_dim(seq_shape: Sequence[int], dist_shape: Sequence[int], ranks: int) -> int | None:
    """The one dim along which `dist_shape` is `seq_shape` divided by `ranks`
    (every other dim equal), else None."""
    if len(seq_shape) != len(dist_shape):
        return None
    diff = [i for i, (a, b) in enumerate(zip(seq_shape, dist_shape)) if a != b]
    if len(diff) == 1 and dist_shape[diff[0]] * ranks == seq_shape[diff[0]]:
        return diff[0]
    return None


def padded_split_dim(seq_shape: Sequence[int], dist_shape: Sequence[int], ranks: int) -> int | None:
    """The one dim along which `dist_shape` holds blocks of ceil(n / ranks) of a
    `seq_shape` dim of n that `ranks` does not divide (every other dim equal), else
    None: a padded split, the last blocks running past the end."""
    if len(seq_shape) != len(dist_shape):
        return None
    diff = [i for i, (a, b) in enumerate(zip(seq_shape, dist_shape)) if a != b]
    if len(diff) == 1 and seq_shape[diff[0]] % ranks \
            and dist_shape[diff[0]] == -(-seq_shape[diff[0]] // ranks):
        return diff[0]
    return None


def reshaped_split_dims(seq_shape: Sequence[int], dist_shape: Sequence[int],
                        ranks: int) -> list[int | None]:
    """The relations under which `dist_shape` holds, reshaped row-major, as many
    elements as its block of `seq_shape`: None for the whole value (replicated), or
    each dim that `ranks` divides (an even split along it). Empty when neither fits."""
    total, local = math.prod(seq_shape), math.prod(dist_shape)
    if local == total:
        return [None]
    if local * ranks != total:
        return []
    return [d for d, s in enumerate(seq_shape) if s % ranks == 0]


def split_dim_of(rel: BlockRelation, ranks: int) -> int | None:
    """The dim `rel` splits evenly over `ranks` in rank order, else None."""
    d = even_split_dim(rel.seq_shape, rel.dist_shape, ranks)
    return d if d is not None and rel == split_relation(rel.seq_shape, d, ranks) else None


def split_relation(shape: Sequence[int], dim: int, ranks: int,
                   segments: Sequence[int] | None = None) -> BlockRelation:
    """Split evenly along `dim`; with `segments` the dim is a concatenation of
    segments, each split evenly, rank r holding its part of every segment in turn.
    Such a block is not contiguous, so only the unsegmented form is a BlockRelation."""
    shape = tuple(int(s) for s in shape)
    if segments:
        raise InputError("segmented splits are not a single block")
    if shape[dim] % ranks:
        raise InputError(f"dim {dim} of size {shape[dim]} does not split evenly over {ranks} ranks")
    loc = shape[dim] // ranks
    local = shape[:dim] + (loc,) + shape[dim + 1:]
    offs = tuple(tuple(r * loc if i == dim else 0 for i in range(len(shape))) for r in range(ranks))
    return BlockRelation(shape, local, offs)


def describe_reconstruction(name: str, rel: BlockRelation, ranks: int) -> str:
    """The reconstruction function for an output whose blocks are `rel`."""
    blocks: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for r, offs in enumerate(rel.offsets[:ranks]):
        blocks[offs].append(r)
    if len(blocks) == 1:
        return f"{name} = r0.{name}  (replicated on all {ranks} ranks)"
    varying = [i for i in range(len(rel.seq_shape)) if len({o[i] for o in blocks}) > 1]

    def build(keys: list[tuple[int, ...]], dims: list[int]) -> str:
        if not dims:
            return f"r{blocks[keys[0]][0]}.{name}"
        d = dims[0]
        by = defaultdict(list)
        for k in keys:
            by[k[d]].append(k)
        parts = [build(by[o], dims[1:]) for o in sorted(by)]
        return f"concat({', '.join(parts)}; dim {d})"

    text = f"{name} = {build(sorted(blocks), varying)}"
    copies = {len(v) for v in blocks.values()}
    if copies != {1}:
        text += f"  (each block held by {max(copies)} ranks)"
    return text
