"""A dynamic_slice of a concatenation that keeps the concatenated dim whole, as
the concatenation of the pieces' dynamic_slices (a rule of the normal form of
dlverify/simplify.py, whose `_Simplifier` runs it in its pass).

    dynamic_slice(concatenate(p_1, ..., p_m; k), s_0, ..., s_n-1)   (size along k: all of it)
  = concatenate(dynamic_slice(p_1, s_0, ..., s_n-1), ..., dynamic_slice(p_m, ...); k)

for every value of the starts, each piece's slice sizes those of the slice but
along k, where the piece is taken whole. HLO's dynamic-slice clamps each start
to [0, dim - size]: along every dim j != k the pieces have the concatenation's
length, so start j clamps alike, and along k the size is the whole length on both
sides, so any start clamps to 0. An identity of data movement.

Why: jax.random.split stacks a key's two words into [n, 2] keys, a data-parallel
program takes its rows at the rank's offset (dynamic_slice_in_dim) and the
sampling reads each word back (a slice of one column). The sequential module's
normal form takes that column straight from its piece (simplify_sink.py:
slice_of_one_piece); the partitioned module's dynamic_slice stood between, so its
concatenation of two different sequential values met nothing. With the
dynamic_slice moved into the pieces the column is the piece's dynamic_slice, a
block of the sequential word. Slices go toward the inputs, as the other rules of
the normal form move them; nothing moves them back out of a concatenation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.ir import Op

if TYPE_CHECKING:
    from dlverify.simplify import _Simplifier


def dynamic_slice_of_concatenation(s: "_Simplifier", op: Op) -> bool:
    """Rewrite `op` as above when it is a dynamic_slice, of a concatenate, whose size
    along the concatenated dim is that dim's whole length; True if it was."""
    if op.kind != "dynamic_slice" or len(op.inputs) < 2:
        return False
    cat = s.producer.get(op.inputs[0])
    if cat is None or cat.kind != "concatenate":
        return False
    k = int(cat.params["dimension"])
    sizes = tuple(op.params["slice_sizes"])
    if len(op.inputs) != 1 + len(sizes) or sizes[k] != s.shape(cat.output)[k]:
        return False
    dtype = s.g.tensors[op.output].dtype
    pieces = []
    for piece in cat.inputs:
        shape = list(sizes)
        shape[k] = s.shape(piece)[k]
        pieces.append(s.new_op("dynamic_slice", [piece, *op.inputs[1:]], tuple(shape), dtype,
                               {**op.params, "slice_sizes": tuple(shape)}, op))
    s.new_op("concatenate", pieces, s.shape(op.output), dtype, dict(cat.params), op,
             output=op.output)
    return True
