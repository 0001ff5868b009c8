"""What a verification run is about: two graphs, the mesh, the boundary relations."""
from __future__ import annotations

from dataclasses import dataclass, field

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
