"""What a verification run is about: two graphs, the mesh, the boundary relations."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dlverify.ir import Graph, IdAllocator, Mesh
from dlverify.relations import BlockRelation


@dataclass
class Problem:
    """`inputs[i]` relates seq.inputs[i] to dist.inputs[i]; `outputs[i]` is the
    expected relation of output i (None: to be inferred and reported)."""

    seq: Graph
    dist: Graph
    mesh: Mesh
    inputs: list[BlockRelation]
    outputs: list[BlockRelation | None]
    ids: IdAllocator
    assumptions: list[str] = field(default_factory=list)
    name: str = ""
    # scans verified by induction (dlverify/induction.py: ScanSummary), and how to
    # rebuild the problem with every scan unrolled (None: no rebuild possible)
    scans: list[Any] = field(default_factory=list)
    unroll: Callable[[], "Problem"] | None = None
    # bring both graphs to the algebraic normal form (dlverify/simplify.py) before
    # export: set for HLO pairs, where an optimising compiler simplified one side
    normal_form: bool = False
    # what the builder says about the problem (e.g. why scans were unrolled):
    # copied into the verdict's notes
    notes: list[str] = field(default_factory=list)
    # values the programs read but neither file states (an elided constant with no
    # twin in the other file): nothing relates to them, so a failure downstream may
    # be theirs. Copied into the verdict and printed with every failing one.
    unknowns: list[str] = field(default_factory=list)
    # what a rewrite refused and why, located at a distributed op (kept_index.Refusal:
    # a gather's index bound cutting rows its mask keeps): listed first among the
    # failures when that op leads to a failing output, never part of the verdict
    diagnoses: list[Any] = field(default_factory=list)
