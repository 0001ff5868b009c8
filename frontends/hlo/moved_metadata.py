"""Where an instruction XLA left without metadata was written, when XLA moved its
metadata onto the layout instructions that read it.

Layout assignment rewrites a convolution (or a dot) into the layout the backend
wants and puts a transpose after it to give the program's layout back; the
transpose, or the copy next to it, gets the convolution's metadata (its op_name
names `conv_general_dilated`) and the convolution keeps none. Such an
instruction is located at the user frames of that reader: found by following the
only reader of its value through layout-only instructions (into a fusion through
the parameter it is passed as), stopping at the first one with metadata, which
must name a primitive this instruction's opcode implements. Nothing is guessed:
no single reader, a reader that computes, or metadata naming another primitive
leave the instruction without user frames.
"""
from __future__ import annotations

from dlverify.frontends.hlo.attributes import parse_metadata
from dlverify.frontends.hlo.model import HloComputation, HloInstruction, HloModule

# The JAX primitives whose metadata an HLO opcode's instruction carries.
PRIMITIVES = {"convolution": {"conv_general_dilated"}, "dot": {"dot_general"}}

# Instructions that only move data into another layout (XLA's layout assignment
# makes them; they carry the metadata it moved).
LAYOUT_ONLY = {"transpose", "copy", "bitcast", "reshape"}

# Readers followed at most (a transpose, a copy, a bitcast, and the fusion around them).
MAX_STEPS = 8


def named_primitives(op_name: str) -> set[str]:
    """The primitives an XLA op_name names ("jit(f)/shard_map/conv_general_dilated":
    conv_general_dilated; several, joined by ';', when XLA merged instructions)."""
    return {part.rsplit("/", 1)[-1].strip() for part in op_name.split(";") if part.strip()}


class MovedMetadata:
    """The reader, per instruction, that holds the metadata XLA moved off it."""

    def __init__(self, module: HloModule) -> None:
        self.m = module
        self._readers: dict[str, dict[str, list[HloInstruction]]] = {}

    def readers(self, comp: HloComputation) -> dict[str, list[HloInstruction]]:
        if comp.name not in self._readers:
            out: dict[str, list[HloInstruction]] = {}
            for ins in comp.instructions:
                for o in ins.operands:
                    out.setdefault(o, []).append(ins)
            self._readers[comp.name] = out
        return self._readers[comp.name]

    def holder(self, ins: HloInstruction, comp: HloComputation) -> tuple[HloInstruction, dict] | None:
        """The layout-only reader of `ins` (through layout-only readers and fusion
        parameters) whose metadata names a primitive `ins`'s opcode implements, with
        that metadata; None when there is no such reader."""
        wanted = PRIMITIVES.get(ins.opcode)
        if not wanted:
            return None
        value, here = ins, comp
        for _ in range(MAX_STEPS):
            readers = self.readers(here).get(value.name, [])
            if len(readers) != 1 or readers[0].operands.count(value.name) != 1:
                return None
            reader = readers[0]
            if reader.opcode == "fusion":   # into the fused computation, as its parameter
                called = self.m.computations.get((reader.attrs.get("calls") or "").lstrip("%"))
                if called is None:
                    return None
                param = called.parameters().get(reader.operands.index(value.name))
                if param is None:
                    return None
                value, here = param, called
                continue
            if reader.opcode not in LAYOUT_ONLY:
                return None
            md = reader.attrs.get("metadata")
            if md:
                val = parse_metadata(md)
                if "stack_frame_id" in val and named_primitives(val.get("op_name", "")) & wanted:
                    return reader, val
                return None
            value = reader
        return None


__all__ = ["LAYOUT_ONLY", "MovedMetadata", "PRIMITIVES", "named_primitives"]
