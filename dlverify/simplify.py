"""Algebraic normal form: the simplifications an optimising compiler makes on one
side only, made on both sides before export.

A module dumped after XLA's optimisations no longer contains `max(x, -inf)`,
reshape chains that end where they began, or `x / y` (it computes `x * (1/y)`),
while the module before optimisations does; the rules relate one op to one
op, so such a pair never met. Each rewrite below is an identity of real
arithmetic or of data movement, applied to both graphs alike, so the verdict
is about the same functions:

* neutral elements: `x + 0`, `x - 0`, `x * 1`, `x / 1`, `max(x, -inf)`,
  `min(x, +inf)` are `x` (the constant operand a splat: a constant holding one
  value, or a broadcast of one);
* layout identities: a reshape to the operand's shape, a broadcast_in_dim
  that maps every dim to itself, a transpose by the identity permutation are
  their operand; a reshape of a reshape is one reshape (both are row-major
  re-indexings of the same elements), and so is a transpose that only moves
  the size-1 dims a reshape inserted (XLA's unrolled scan transposes a
  micro-batch's [1, m, n] to [m, 1, n]), and reshapes on both sides of an
  all-reduce that cancel are dropped (the partitioner's keepdims row statistic,
  dlverify/simplify_int.py); an iota of rank > 1 is the broadcast of
  a 1-D iota (never the other way round: a program that adds a rank offset to
  its 1-D positions before broadcasting them keeps that form);
* reciprocals: `x * (1 / y)` is `x / y` (also through a broadcast_in_dim of
  the reciprocal, which is moved onto y), and `x * 2^-k` (k >= 1, a splat
  literal: XLA's folded `x / 2^k`) is `x / 2^k`; `pow(a, -b)` is
  `1 / pow(a, b)` (XLA's form of the latter);
* masks: `p * x` for a boolean p is `select(p, x, 0)` (x real), the form XLA
  writes for a one-hot product and for its padding masks;
* reshapes sink toward the outputs: an elementwise op of reshapes of tensors
  of one shape (and splats) is the reshape of the op on that shape, and a dot
  of a reshape that only regroups an operand's free dims (batch dims kept,
  contracted dims regrouped among themselves at most) is a reshape of the dot
  of a reshape keeping them (XLA flattens [b, s, h, d] to [b*s, h*d] around
  a matmul; the program merges h*d only); reshape chains then collapse; a
  dot contracting dims that both operands flattened alike from runs of the
  same sizes (perhaps transposed after) contracts the runs pairwise (XLA
  flattens a [g, j, d, e] weight, and [b, s, n] activations to [b*s, n] for a
  weight gradient);
* negations leave sums: `sum(-x)` is `-sum(x)`;
* dot operand layout: each operand of a dot_general is put in one standard
  order (lhs: batch, free, contracted dims; rhs: batch, contracted, free; the
  free dims in their own order, so the result is the same) by a transpose,
  composed with the transpose that produced it: `dot(x, k)` contracting k's
  dim 1 and `dot(x, transpose(k))` contracting its dim 0 meet as the latter,
  and a transpose into a dot that only undid the operand's order vanishes
  (the contracted pairs listed in one order first: dlverify/contraction_order.py).

More rules are in dlverify/simplify_forms.py: values computed twice (also
with a commutative op's operands swapped) computed once, size-1 dims deleted
around dots and broadcasts kept in them (a size-1 dim of each dot operand
becomes a batch dim), a transpose that swaps a dot's free dims as the dot of
the swapped operands (transposes move before all-reduces to meet it), and a
reduction over whole groups of a reshape as the reduction of its operand. In
dlverify/simplify_sink.py: reshapes and transposes past gathers, slices and
concatenations, and free runs merged under a transpose out of dots, so a dot
reads its free dims unmerged whichever side merges them where.
In dlverify/concat_slices.py: a dynamic_slice of a concatenation that keeps the
concatenated dim whole is the concatenation of the pieces' dynamic_slices.

Every rewrite must be confluent: it may only make the two sides more alike,
whatever the other side does around it. A rewrite that reads an op's producer
cannot see through a collective, so each moves toward the form the optimised,
partitioned side has (reshapes toward the outputs, out of dots, folded into
reductions) and leaves alone what it cannot bring there; simplify_forms.py
says where its rules stay incomplete.

It runs on HLO pairs (`Problem.normal_form`, set by frontends/hlo/pairing.py:
`check`, `check-dump`, jit with shardings), whose distributed module an
optimising compiler may have simplified; a shard_map program and its
sequential twin are traced alike and keep their own ops, which the rules (and
their tests) are written against.

Ops a rewrite leaves unread are dropped, as in dlverify/rewrites.py (whose
helpers this uses); ops the program itself left unread are kept.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dlverify.concat_slices import dynamic_slice_of_concatenation
from dlverify.contraction_order import contracted_pairs_in_source_order
from dlverify.dot_orientation import PartnerLayouts
from dlverify.ir import FoldedOp, Graph, IdAllocator, Op, literal_value
from dlverify.rewrites import _drop_newly_dead, _unused
from dlverify.simplify_accumulate import accumulate_forms
from dlverify.simplify_compiled import compiled_forms
from dlverify.simplify_int import reshaped_all_reduce
from dlverify.simplify_merged import merged_forms
from dlverify.simplify_moves import _MoveRules
from dlverify.simplify_layouts import _LayoutRules
from dlverify.simplify_reciprocals import scaled_reciprocal
from dlverify.simplify_reshapes import _ReshapeRules
from dlverify.simplify_sink import _SinkRules
from dlverify.simplify_transposes import transpose_forms
from dlverify.diagonal_sums import diagonal_sum
from dlverify.unit_layouts import dot_roles, lone_units_batched
from dlverify.unit_placement import reduced_axes, unit_move_under_transpose, unit_reduction_as_reshape
from dlverify.unit_transposed import deleted_units_under_transpose

# op kind -> (neutral value, operand positions it may take)
_NEUTRAL: dict[str, tuple[float, tuple[int, ...]]] = {
    "add": (0.0, (0, 1)), "sub": (0.0, (1,)), "mul": (1.0, (0, 1)), "div": (1.0, (1,)),
    "max": (-math.inf, (0, 1)), "min": (math.inf, (0, 1)),
}
# passes at most (Llama-3 with one KV head per rank, after optimisations, reaches its
# fixpoint in 10: a dot's size-1 dims lifted, batched, its operands reordered, a
# reshape under their transposes moved out and sunk past the dot; a training step in 7)
_PASSES = 16


class _Simplifier(_MoveRules, _SinkRules, _LayoutRules, _ReshapeRules):
    """One pass (`run`) in op order, so every producer is seen before its readers;
    op creation, aliases and folds as in rewrites._Rewriter; the rules of
    dlverify/simplify_forms.py, simplify_sink.py, simplify_moves.py and
    simplify_reshapes.py too."""

    partner_dots = None     # the sequential program's dot_roles (dlverify/unit_layouts.py)
    partner_reductions = None   # and its reduced_axes (dlverify/unit_placement.py)
    merge_sums = True       # sums of dots merged into one (simplify_accumulate.py)

    # -- the rewrites: each returns True when it replaced `op` --------------
    def neutral(self, op: Op) -> bool:
        spec = _NEUTRAL.get(op.kind)
        if spec is None or len(op.inputs) != 2:
            return False
        value, positions = spec
        out = self.g.tensors[op.output]
        for pos in positions:
            keep = op.inputs[1 - pos]
            kept = self.g.tensors[keep]
            if self.splat(op.inputs[pos]) == value and kept.shape == out.shape \
                    and kept.dtype == out.dtype:
                return self.fold(op, keep)
        return False

    def literal_difference(self, op: Op) -> bool:
        """`x - c` is `x + (-c)` for a splat literal c, exactly in floating point too
        (subtraction adds the negated operand), the form XLA's algebraic simplifier
        writes: jax.random's uniform sampling computes `bits - 1.0`, XLA `bits + -1`.
        For a signed integer type too, when -c is one of its values (c not its
        minimum): then x - c = x + (-c) for every x, over the integers and wrapped
        alike (position ids `cumsum(mask) - 1`, XLA's `+ -1`); not for unsigned types,
        where -c is no value (XLA's wrapped 2^n - c is another literal)."""
        if op.kind != "sub" or len(op.inputs) != 2:
            return False
        out = self.g.tensors[op.output]
        x = op.inputs[0]
        if self.splat(x) is not None or self.shape(x) != out.shape \
                or self.g.tensors[x].dtype != out.dtype:
            return False
        dtype = np.dtype(out.dtype)
        if np.issubdtype(dtype, np.floating):
            c = self.splat(op.inputs[1])
        elif np.issubdtype(dtype, np.signedinteger):
            c = self.int_splat(op.inputs[1])
            if c is not None and c == np.iinfo(dtype).min:
                return False
        else:
            return False
        if c is None:
            return False
        negated = self.splat_of(-c, out.shape, out.dtype, op)
        self.new_op("add", [x, negated], out.shape, out.dtype, {}, op, output=op.output)
        return True

    def int_splat(self, t: int) -> int | None:
        """The one integer tensor t holds everywhere (a constant, or a broadcast or
        reshape of one), exactly (splat reads it as a float)."""
        v = literal_value(self.producer, t, ("broadcast_in_dim", "reshape"))
        if v is None or v.size == 0 or not np.issubdtype(v.dtype, np.integer) \
                or not (v == v.flat[0]).all():
            return None
        return int(v.flat[0])

    def layout(self, op: Op) -> bool:
        x = op.inputs[0] if op.inputs else None
        if x is None or self.g.tensors[x].dtype != self.g.tensors[op.output].dtype:
            return False
        same = self.shape(x) == self.shape(op.output)
        if op.kind == "reshape":
            src = self.producer.get(x)
            if src is not None and src.kind == "reshape":    # reshape of a reshape
                x = src.inputs[0]
                if self.shape(x) != self.shape(op.output):
                    self.new_op("reshape", [x], self.shape(op.output), self.g.tensors[x].dtype, {},
                             op, output=op.output)
                    return True
                same = True
            return self.fold(op, x) if same else False
        if op.kind == "broadcast_in_dim" and same and \
                tuple(op.params["broadcast_dimensions"]) == tuple(range(len(self.shape(x)))):
            return self.fold(op, x)
        if op.kind != "transpose":
            return False
        perm = tuple(op.params["permutation"])
        src = self.producer.get(x)
        if src is not None and src.kind == "transpose":      # a transpose of a transpose
            inner = src.params["permutation"]
            x, perm = src.inputs[0], tuple(inner[j] for j in perm)
            if perm != tuple(range(len(perm))):
                self.new_op("transpose", [x], self.shape(op.output), self.g.tensors[x].dtype,
                            {"permutation": perm}, op, output=op.output)
                return True
        if perm == tuple(range(len(self.shape(x)))):
            return self.fold(op, x)
        # A transpose moving only the size-1 dims that a reshape inserted (into an
        # operand without any) inserts them where it puts them: one reshape. Not of
        # any operand: a dot's own size-1 dims stay in it (unit_dims_into_dot), in
        # the order dot_layout transposes them to.
        moved = [d for d in perm if self.shape(x)[d] != 1]
        src = self.producer.get(x)
        if src is not None and src.kind == "reshape" and moved == sorted(moved) \
                and [n for n in self.shape(x) if n != 1] == list(self.shape(src.inputs[0])):
            self.new_op("reshape", [src.inputs[0]], self.shape(op.output),
                        self.g.tensors[x].dtype, {}, op, output=op.output)
            return True
        return False

    def iota_1d(self, op: Op) -> bool:
        """An iota of rank > 1 counting along d is the broadcast of the 1-D iota
        of that dim's length (the form a program that broadcasts its positions
        has; an optimiser builds the multi-dim iota directly)."""
        shape = self.shape(op.output)
        if op.kind != "iota" or len(shape) < 2:
            return False
        d = op.params["dimension"]
        dtype = self.g.tensors[op.output].dtype
        line = self.new_op("iota", [], (shape[d],), dtype, {"dimension": 0}, op)
        self.new_op("broadcast_in_dim", [line], shape, dtype, {"broadcast_dimensions": (d,)}, op,
                    output=op.output)
        return True

    def reciprocal(self, op: Op) -> bool:
        if op.kind != "mul" or len(op.inputs) != 2:
            return False
        for pos in (0, 1):
            r = self.producer.get(op.inputs[pos])
            bcast = None
            if r is not None and r.kind == "broadcast_in_dim":
                bcast, r = r, self.producer.get(r.inputs[0])
            if r is None or r.kind != "div" or self.splat(r.inputs[0]) != 1.0 \
                    or self.shape(r.inputs[0]) != self.shape(r.inputs[1]):
                continue
            y, x = r.inputs[1], op.inputs[1 - pos]
            if self.shape(op.inputs[pos]) != self.shape(x):
                continue
            if bcast is not None:
                y = self.new_op("broadcast_in_dim", [y], self.shape(bcast.output),
                                self.g.tensors[y].dtype, bcast.params, bcast)
            self.new_op("div", [x, y], self.shape(op.output), self.g.tensors[op.output].dtype, {},
                     op, output=op.output)
            return True
        return False

    def exact_scaling(self, op: Op) -> bool:
        """`x * c` for a splat literal c = ±2^-k (k >= 1), whose reciprocal is an
        exact integer (XLA writes `x / 32` as `x * 0.03125`), is `x / (1/c)`, so
        it meets the division; other literals are left alone (`x * 0.33333334`
        is not `x / 3` over the reals, and `x * 2` is no division in disguise)."""
        if self.float_binary(op, "mul") is None:
            return False
        for pos in (0, 1):
            c, x = op.inputs[pos], op.inputs[1 - pos]
            value = self.splat(c)
            if value is None or not math.isfinite(value) or value == 0.0 \
                    or self.shape(x) != self.shape(op.output) \
                    or self.g.tensors[x].dtype != self.g.tensors[op.output].dtype:
                continue
            dtype = self.g.tensors[c].dtype
            inv = np.asarray(1.0, dtype) / np.asarray(value, dtype)
            if not np.isfinite(inv) or abs(float(inv)) <= 1 or not float(inv).is_integer() \
                    or Fraction(float(inv)) * Fraction(value) != 1:
                continue                            # only x * 2^-k, written for x / 2^k
            y = self.splat_of(inv, self.shape(c), dtype, op)
            self.new_op("div", [x, y], self.shape(op.output), self.g.tensors[op.output].dtype, {},
                        op, output=op.output)
            return True
        return False

    def negative_power(self, op: Op) -> bool:
        """`pow(a, -b)` is `1 / pow(a, b)` (XLA writes `1 / pow(a, b)` as the former;
        the reciprocal then meets `x * (1/y)` as `x / y` on both sides)."""
        if op.kind != "pow" or len(op.inputs) != 2:
            return False
        neg = self.producer.get(op.inputs[1])
        out = self.g.tensors[op.output]
        if neg is None or neg.kind != "neg" or not np.issubdtype(np.dtype(out.dtype), np.floating):
            return False
        power = self.new_op("pow", [op.inputs[0], neg.inputs[0]], out.shape, out.dtype, {}, op)
        ones = self.splat_of(1, out.shape, out.dtype, op)
        self.new_op("div", [ones, power], out.shape, out.dtype, {}, op, output=op.output)
        return True

    def mask_product(self, op: Op) -> bool:
        """`p * x` for a boolean mask p is `select(p, x, 0)` (select_n(p, 0, x)) over
        the reals (x real, so never 0 * inf): XLA writes `one_hot * x` as the
        select, and masks padding with the same select, which the rules read."""
        out = self.float_binary(op, "mul")
        if out is None:
            return False
        for pos in (0, 1):
            p, x = op.inputs[pos], op.inputs[1 - pos]
            if self.g.tensors[p].dtype != "bool" or self.g.tensors[x].dtype != out.dtype \
                    or not self.shape(p) == self.shape(x) == out.shape:
                continue
            zeros = self.splat_of(0, out.shape, out.dtype, op)
            self.new_op("select_n", [p, zeros, x], out.shape, out.dtype, {}, op, output=op.output)
            return True
        return False

    def dot_layout(self, op: Op) -> bool:
        """Put each dot operand in the standard order (lhs: batch, free, contracted;
        rhs: batch, contracted, free; free dims keep their order, so the result
        is unchanged) by a transpose, composed with a transpose that produced the
        operand (an identity composition is no transpose at all)."""
        if op.kind != "dot_general" or len(op.inputs) != 2:
            return False
        p = dict(op.params)
        ins = list(op.inputs)
        changed = False
        for side, key in ((0, "lhs"), (1, "rhs")):
            x = ins[side]
            rank = len(self.shape(x))
            contract, batch = list(p[f"{key}_contract"]), list(p[f"{key}_batch"])
            free = [d for d in range(rank) if d not in contract and d not in batch]
            order = batch + (free + contract if side == 0 else contract + free)
            if order == list(range(rank)):
                continue
            src, perm = x, order
            t = self.producer.get(x)
            if t is not None and t.kind == "transpose":
                inner = list(t.params["permutation"])
                src, perm = t.inputs[0], [inner[j] for j in order]
            if perm != list(range(rank)):
                src = self.new_op("transpose", [src], tuple(self.shape(x)[j] for j in order),
                               self.g.tensors[x].dtype, {"permutation": tuple(perm)}, op)
            ins[side] = src
            nb, nc = len(batch), len(contract)
            p[f"{key}_batch"] = tuple(range(nb))
            p[f"{key}_contract"] = tuple(range(nb + len(free), rank) if side == 0
                                         else range(nb, nb + nc))
            changed = True
        if changed:
            self.new_op("dot_general", ins, self.shape(op.output), self.g.tensors[op.output].dtype,
                     p, op, output=op.output)
        return changed

    def scalar_of_splat(self, t: int) -> int | None:
        """The rank-0 tensor that t broadcasts (a splat of a scalar, whatever its value)."""
        op = self.producer.get(t)
        if op is not None and op.kind == "broadcast_in_dim" and self.shape(op.inputs[0]) == ():
            return op.inputs[0]
        return None

    def negated_sum(self, op: Op) -> bool:
        """`sum(-x)` is `-sum(x)`: negations leave reductions toward the outputs, as
        reshapes do (XLA sums the one-hot gradient before negating it)."""
        if op.kind != "reduce_sum":
            return False
        neg = self.producer.get(op.inputs[0])
        if neg is None or neg.kind != "neg":
            return False
        dtype = self.g.tensors[op.output].dtype
        total = self.new_op("reduce_sum", [neg.inputs[0]], self.shape(op.output), dtype,
                            op.params, op)
        self.new_op("neg", [total], self.shape(op.output), dtype, {}, op, output=op.output)
        return True

    def masked_neg(self, op: Op) -> bool:
        """`select(p, -x, 0)` is `-select(p, x, 0)` (-0 = 0 over the reals): negations
        leave masks toward the outputs, as they leave sums, so a partitioned program
        that masks its padding between the negation and the sum meets the sequential
        `-sum(x)` (negated_sum)."""
        if op.kind != "select_n" or len(op.inputs) != 3:
            return False
        for pos in (1, 2):
            neg = self.producer.get(op.inputs[pos])
            if neg is None or neg.kind != "neg" or self.splat(op.inputs[3 - pos]) != 0.0:
                continue
            out = self.g.tensors[op.output]
            ins = list(op.inputs)
            ins[pos] = neg.inputs[0]
            masked = self.new_op("select_n", ins, out.shape, out.dtype, {}, op)
            self.new_op("neg", [masked], out.shape, out.dtype, {}, op, output=op.output)
            return True
        return False

    def run(self) -> bool:
        changed = False
        for op in self.g.ops:
            op.inputs = [self.alias.get(i, i) for i in op.inputs]
            if self.rules(op):
                changed = True
                continue
            self.out.append(op)
            self.producer[op.output] = op
        if changed:
            self.g.outputs = [self.alias.get(t, t) for t in self.g.outputs]
            self.g.ops = self.out
        return changed

    def rules(self, op: Op) -> bool:
        """Whether a rule of the normal form replaced `op` (the first that applies)."""
        return bool(self.neutral(op) or self.literal_difference(op) or self.layout(op)
                    or unit_reduction_as_reshape(self, op) or unit_move_under_transpose(self, op)
                    or self.iota_1d(op) or self.reciprocal(op)
                    or scaled_reciprocal(self, op)
                    or self.literal_product(op)
                    or self.exact_scaling(op) or self.mask_product(op)
                    or self.negative_power(op)
                    or contracted_pairs_in_source_order(self, op)
                    or self.dot_layout(op) or self.sink_reshape(op)
                    or self.unit_dims_into_dot(op) or deleted_units_under_transpose(self, op)
                    or self.unit_dims_batched(op)
                    or lone_units_batched(self, op)
                    or self.unit_dims_into_broadcast(op) or self.layouts(op)
                    or transpose_forms(self, op) or diagonal_sum(self, op)
                    or self.transpose_into_all_reduce(op) or reshaped_all_reduce(self, op)
                    or op.kind == "all_reduce" and len(op.inputs) == 1
                    and self.all_reduce(op, through_transpose=False)
                    or self.reshape_out_of_all_gather(op)
                    or self.transpose_out_of_all_gather(op) or self.literal_dynamic_slice(op)
                    or dynamic_slice_of_concatenation(self, op)
                    or self.slice_moves(op)
                    or self.concatenate_of_reshapes(op)
                    or self.free_merge_under_transpose(op)
                    or self.sink_dot_reshape(op) or self.split_contraction(op)
                    or self.negated_sum(op) or self.masked_neg(op) or compiled_forms(self, op)
                    or (self.merge_sums or op.kind != "add") and accumulate_forms(self, op)
                    or merged_forms(self, op)
                    or self.reduce_of_reshape(op) or self.moves(op)
                    or self.common_value(op))


def simplify_graph(graph: Graph, ids: IdAllocator, assumptions: list[str] | None = None,
                   notes: list[str] | None = None, partner: Graph | None = None,
                   merge_sums: bool = True) -> bool:
    """Bring `graph` to the normal form (see the module docstring); returns
    whether anything changed. `assumptions`: where a rule that rounds a literal
    (simplify_forms.literal_product) lists it; `notes`: where a normal form still
    changing after the last pass is reported (a rewrite cycle would otherwise
    pass unseen, its failures blamed on the program); `partner`: the sequential
    program in its normal form, when `graph` is the distributed one (whose dots take
    size-1 batch dims as the partner's do: dlverify/unit_layouts.py); `merge_sums`:
    whether sums of dots become one dot (simplify_accumulate.py; not once a sum's
    contracted concatenation was split, rewrites.split_contracted_concatenations)."""
    partner_dots = dot_roles(partner) if partner is not None else None
    partner_layouts = PartnerLayouts(partner) if partner is not None else None
    partner_reductions = reduced_axes(partner) if partner is not None else None
    unused = _unused(graph)
    changed = False
    alias: dict[int, int] = {}      # every pass's: tensor -> the tensor now holding its value
    # One pass simplifies whole chains (aliases and new producers are seen by
    # the ops after them); a few more catch what a rewrite newly exposes.
    # (most of simplify_layouts.py's rules join once the others settled: see `late` there)
    for late in (False, True):
        for _ in range(_PASSES):
            simplifier = _Simplifier(graph, ids, assumptions)
            simplifier.late = late
            simplifier.partner_dots = partner_dots
            simplifier.partner_layouts = partner_layouts
            simplifier.partner_reductions = partner_reductions
            simplifier.merge_sums = merge_sums
            if not simplifier.run():
                break
            alias.update(simplifier.alias)
            changed = True
        else:
            note = (f"the {graph.name} program's normal form (dlverify/simplify.py) was still "
                    f"changing after {_PASSES} passes: a failure may come from that, not from "
                    f"the program")
            if notes is not None and note not in notes:
                notes.append(note)
    if changed:
        _drop_newly_dead(graph, unused)
        _retarget_folded(graph, alias)
    return changed


def _retarget_folded(graph: Graph, alias: dict[int, int]) -> None:
    """A folded op names the tensor holding its value; a later pass may have folded
    or dropped that tensor in turn: follow the aliases, and forget the ones whose
    value is gone (diagnosis reads them, dlverify/correspondence.py)."""
    kept = []
    for f in graph.folded:
        value, seen = f.value, set()
        while value in alias and value not in seen:
            seen.add(value)
            value = alias[value]
        if value in graph.tensors:
            kept.append(FoldedOp(f.kind, f.loc, value))
    graph.folded = kept


__all__ = ["simplify_graph"]
