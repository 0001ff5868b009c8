"""The parsed form of an HLO text module: `HloModule` -> `HloComputation` ->
`HloInstruction`, with shapes parsed (`HloShape`) and attributes kept as raw
text (frontends/hlo/attributes.py reads them); the element types and the
opcodes XLA prints.

Limits (documented bounds; anything beyond is an InputError naming the line):
MAX_RANKS ranks (num_partitions * replica_count, --ranks), MAX_DIM elements per
dimension, MAX_ELEMENTS elements per array, MAX_TUPLE_DEPTH nesting of tuple
shapes and tuple shardings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlverify.ir import is_float_dtype

# The rank count is bounded: every rank's block and group is materialised,
# so 10^11 ranks would exhaust memory long before any answer.
MAX_RANKS = 65536
# XLA's own dimension sizes are int64, but nothing this tool can verify has a
# dimension beyond 2^31 or an array beyond 2^40 elements: larger is a typo or
# a hostile file, and such numbers overflow numpy's index arithmetic.
MAX_DIM = 2 ** 31
MAX_ELEMENTS = 2 ** 40
# Real modules nest tuples a few levels deep; the parsers are bounded so that
# a pathological file is an error, not a RecursionError.
MAX_TUPLE_DEPTH = 64

FLAT_AXIS = "_flat"

# ---------------------------------------------------------------------------
# Element types

DTYPES = {
    "pred": "bool", "s2": "int2", "s4": "int4", "s8": "int8", "s16": "int16", "s32": "int32",
    "s64": "int64", "u2": "uint2", "u4": "uint4", "u8": "uint8", "u16": "uint16",
    "u32": "uint32", "u64": "uint64", "f16": "float16", "bf16": "bfloat16", "f32": "float32",
    "f64": "float64", "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "f8e4m3fnuz": "float8_e4m3fnuz",
    "f8e5m2fnuz": "float8_e5m2fnuz", "f8e4m3b11fnuz": "float8_e4m3b11fnuz",
    "f8e4m3": "float8_e4m3", "f8e3m4": "float8_e3m4", "f8e8m0fnu": "float8_e8m0fnu",
    "f4e2m1fn": "float4_e2m1fn", "token": "token", "opaque": "opaque",
}


def np_dtype(dtype: str) -> Any:
    """The numpy dtype for an IR dtype name (ml_dtypes for the narrow floats)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    try:
        import ml_dtypes  # shipped with jaxlib
        return np.dtype(getattr(ml_dtypes, dtype))
    except (ImportError, AttributeError, TypeError):
        return np.dtype(np.float64 if is_float_dtype(dtype) else np.int64)


# Every opcode XLA prints (hlo_opcode.h), translated or not: anything else is a
# malformed file. `cross-replica-sum` is the old name of all-reduce.
KNOWN_OPCODES = frozenset("""
abs add add-dependency after-all all-gather all-gather-done all-gather-start all-reduce
all-reduce-done all-reduce-start all-to-all and async-done async-start async-update atan2
batch-norm-grad batch-norm-inference batch-norm-training bitcast bitcast-convert broadcast
call cbrt ceil cholesky clamp clz collective-broadcast collective-permute
collective-permute-done collective-permute-start compare complex concatenate conditional
constant convert convolution copy copy-done copy-start cosine count-leading-zeros
cross-replica-sum custom-call divide domain dot dynamic-reshape dynamic-slice
dynamic-update-slice erf exponential exponential-minus-one fft floor fusion gather
get-dimension-size get-tuple-element imag infeed iota is-finite log log-plus-one logistic
map maximum minimum multiply negate not opt-barrier optimization-barrier or outfeed pad
parameter partition-id popcnt power ragged-all-to-all ragged-dot real recv recv-done reduce
reduce-precision reduce-scatter reduce-window remainder replica-id reshape reverse rng
rng-bit-generator rng-get-and-update-state round-nearest-afz round-nearest-even rsqrt
scaled-dot scatter select select-and-scatter send send-done set-dimension-size shift-left
shift-right-arithmetic shift-right-logical sign sine slice sort sqrt stochastic-convert
subtract tan tanh topk transpose triangular-solve tuple while xor
""".split())

# Attributes naming called computations.
CALL_ATTRS = ("to_apply", "calls", "condition", "body", "true_computation",
               "false_computation", "branch_computations", "called_computations")


# ---------------------------------------------------------------------------
# Parsed structure


@dataclass(frozen=True)
class HloShape:
    """An array shape (`dtype` an IR dtype name such as "float32") or a tuple
    (`dtype` "tuple", `elements` set). `layout` is minor-to-major, None if not
    printed."""

    dtype: str
    dims: tuple[int, ...] = ()
    layout: tuple[int, ...] | None = None
    elements: tuple["HloShape", ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def minor_to_major(self) -> tuple[int, ...]:
        if self.layout is not None and len(self.layout) == len(self.dims):
            return self.layout
        return tuple(reversed(range(len(self.dims))))

    def leaves(self) -> list["HloShape"]:
        """The array shapes of a (nested) tuple, depth first, left to right."""
        out: list[HloShape] = []
        stack: list[HloShape] = [self]
        while stack:
            s = stack.pop()
            if s.is_tuple:
                stack.extend(reversed(s.elements))
            else:
                out.append(s)
        return out

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(e) for e in self.elements) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass
class HloInstruction:
    name: str
    shape: HloShape
    opcode: str
    operands: list[str]          # operand instruction names (no `%`)
    raw_operands: str            # the text between the parentheses
    attrs: dict[str, str]        # attribute -> raw value text
    line: int
    is_root: bool = False


@dataclass
class HloComputation:
    name: str
    instructions: list[HloInstruction]   # topological order
    by_name: dict[str, HloInstruction]
    root: HloInstruction
    line: int
    is_entry: bool = False

    def parameters(self) -> dict[int, HloInstruction]:
        out = {}
        for ins in self.instructions:
            if ins.opcode == "parameter":
                out[int(ins.raw_operands.strip())] = ins
        return out


@dataclass
class FrameTables:
    """The FileNames / FunctionNames / FileLocations / StackFrames tables."""

    file_names: dict[int, str] = field(default_factory=dict)
    function_names: dict[int, str] = field(default_factory=dict)
    file_locations: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    stack_frames: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class HloModule:
    name: str
    file: str
    attrs: dict[str, str]
    computations: dict[str, HloComputation]
    entry: HloComputation
    frames: FrameTables = field(default_factory=FrameTables)

    def _int_attr(self, key: str) -> int | None:
        v = self.attrs.get(key)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    @property
    def num_partitions(self) -> int | None:
        return self._int_attr("num_partitions")

    @property
    def replica_count(self) -> int | None:
        return self._int_attr("replica_count")

    @property
    def partitioned(self) -> bool:
        """True for the output of XLA's SPMD partitioner (per-device shapes): it
        renames the entry computation to `*_spmd`."""
        return self.entry.name.endswith("_spmd")

