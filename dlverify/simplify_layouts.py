"""More of the algebraic normal form (dlverify/simplify.py, whose `_Simplifier`
runs these rules in its pass): one place for a
transpose of a dot's result, whichever side transposes where.

A value that one side keeps in one layout and transposes for a reader, the
other side computes in the reader's layout: XLA gathers k = x @ w over the
context-parallel ranks and transposes it for q k^T, where the program's k^T is
w^T x^T; it transposes a scaled dot (q k^T * 0.5) that the program transposes
before scaling. So transposes move toward the dot that produces the value, and a
dot takes a transpose it can compute whole:

* transposed dots: transpose(dot(a, b)) by P, when P lists the dot's batch dims
  first, then one operand's free dims, then the other's (in any order within
  each), is dot'(a', b'), the dot with its batch and free dims so ordered (the
  operands swapped when P reads b's free dims first, each transposed to match).
  Also through a reshape of the dot's result that merges runs of dims within each
  of those groups, and through all-gathers of it (gathering dim k of the result
  is gathering the dim of dot' that k becomes: each rank permutes its block
  alike) and collective_permutes (a ring pass sends a rank's whole value: the
  transposed k a zigzag ring passes on). Size-1 dims go with their group
  wherever P puts them (where a side puts a rank's batch of one says nothing).
  When P moves batch dims among free dims that are one operand's, then the
  other's, the dot takes the order of the free
  dims and a transpose moving the batch dims is left: transpose(dot', R) (Ulysses:
  the program's dq^T = k^T ds^T transposed to [q, h, d], where XLA computes
  dq = ds k as [h, q, d] and transposes it alike). A transpose interleaving the
  operands' sized free dims is split too, into the dot' whose lhs is the operand P
  reads a sized free dim of first, free dims in P's order, and the transpose left:
  one orientation per dot (JAX's grouped attention output v^T p^T and the program's
  p v, both transposed to [b, q, k, g, j] for the output projection). One
  interleaving them by a size-1 dim alone stays (XLA's one expert per rank, which
  the program batches). Where a rank's block of a dim has size 1 and the program's is
  sized (one head per rank), the distributed side reads the dims otherwise; there
  it takes the form (either orientation, or the transpose left) that the sequential
  program's normal form holds when its default is none it holds
  (dlverify/dot_orientation.py, tests/test_dot_orientation.py). Nor is a transpose
  split while its readers all take its layout into
  their own (a transpose composing the two; a dot contracting one of its batch dims,
  whose operand order simplify.dot_layout composes with it): the composition is split
  as a whole or stays, as the other side's single transpose does. A reader that
  reads it as it is (a dot in dot_layout's order, anything else) keeps the value in
  that layout, so it is split whatever its other readers do: JAX's attention output
  `v^T p^T` transposed to [b, q, e, h] for the output projection then meets XLA's
  `p v` transposed alike, also where one side's compiler merged a second reader
  (a data-parallel Llama step's query gradient, read by its weight gradient and a
  transpose on the sequential side only);
* transposes enter concatenations, slices and elementwise ops of one tensor and
  splats: transpose(concat(x_i; k)) is concat(transpose(x_i); P^-1(k)), also
  through the collective_permutes between them (rotated halves of k passed on a
  ring, as the sequential concatenation XLA moved a transpose into); a
  transpose of a slice or of a dynamic slice is the slice of the transpose with
  its bounds, strides, starts and sizes permuted alike (dynamic_slice clamps each
  start in its own dim); transpose(f(x, splats)) is f(transpose(x), splats);
* a broadcast_in_dim of a reshape that only inserts size-1 dims broadcasts the
  reshape's operand (the program's iota reshaped to [1, n] before a mask's
  broadcast; XLA broadcasts the iota); a reshape that only inserts size-1 dims
  into a broadcast_in_dim is the broadcast to its shape (the program reshapes its
  [b, h, q, k] causal mask to [1, b, h, q, k]; XLA broadcasts it there), in every
  pass.

No rule moves a transpose out of a slice, a concatenation or an elementwise op,
and a transpose enters an all-gather (against simplify_sink.transpose_out_of_all_gather,
which moves transposes of gathered operands out) or a collective_permute (against
simplify_moves.layout_out_of_permute) only when the dot or concatenation under it
takes it whole in the same rewrite (or, under a permute, the slice, dynamic slice or
all-reduce: simplify_transposes.transpose_into_permute), so no transpose is left under
the collective.

A transposed dot is taken in every pass (as the swapped dot was before); the
other rules join once the rest settled (`late`): moving transposes into slices,
concatenations and elementwise ops while the size-1 dims rules still restructure
the dots they reach (a rank's batch of one, one KV head per rank) meets those dots
unsettled on one side only.

Each an identity of data movement for every input; tests/test_simplify_layouts.py
checks each numerically (on several ranks for the gathers) and where it must
not fire.
"""
from __future__ import annotations


from dlverify.dot_orientation import Form, dot_sizes
from dlverify.ir import Op
from dlverify.ops.table import KINDS, Family
from dlverify.rewrites import _dot_out_dim, _Rewriter
from dlverify.simplify_forms import _merge_groups, _unit_deletion


def _standard_operand(params: dict, key: str, rank: int) -> bool:
    """Whether a dot reads its operand `key` (lhs, rhs) in simplify.dot_layout's order:
    lhs batch, free, contracted dims; rhs batch, contracted, free dims."""
    batch, contract = list(params[f"{key}_batch"]), list(params[f"{key}_contract"])
    free = [d for d in range(rank) if d not in batch and d not in contract]
    order = batch + (free + contract if key == "lhs" else contract + free)
    return order == list(range(rank))


def _permuted(values, perm) -> tuple:
    return tuple(values[j] for j in perm)


class _LayoutRules(_Rewriter):
    """The rules above, for `_Simplifier` (dlverify/simplify.py) to run in its pass."""

    late = False     # whether these rules run (see the module docstring)
    # the sequential program's dots and transposed dots (dlverify/dot_orientation.py),
    # on the distributed graph only (None: the sequential one)
    partner_layouts = None
    _readers: dict[int, list[Op]] | None = None     # (`readers`', once per pass)

    def layouts(self, op: Op) -> bool:
        """Whether one of this module's rules replaced `op`."""
        if op.kind == "transpose" and (self.transposed_dot(op) or self.unit_move_of_reshape(op)):
            return True
        if op.kind == "dot_general" and (self.free_units_out_of_dot(op)
                                         or self.dot_of_free_concatenation(op)):
            return True
        if op.kind == "reshape" and self.broadcast_under_unit_insertion(op):
            return True
        if not self.late:
            return False
        if op.kind == "broadcast_in_dim":
            return self.unit_insertion_into_broadcast(op)
        if op.kind != "transpose":
            return False
        return (self.transpose_into_concatenate(op)
                or self.transpose_into_slice(op) or self.transpose_into_elementwise(op))

    def unit_move_of_reshape(self, op: Op) -> bool:
        """A transpose of a reshape of x, x without size-1 dims: when it moves size-1
        dims only (the sized dims keep their order) it moves no element and is one
        reshape of x, row-major order kept (XLA splits a decoding step's q = x @ w into
        [b, h, e, 1] and moves the query position of one before e; the program reshapes
        to [b, h, e]); when the reshape only inserts size-1 dims into x = transpose(y)
        or x = a dot, it is x transposed by the order the transpose gives x's dims, then
        that reshape: the two transposes compose (a bitcast between layouts, lowered as
        transpose, reshape, transpose), or the dot takes the transpose (transposed_dot:
        the program's gate weight gradient dgate^T h, [f, d], reshaped to [f, 1, d] and
        transposed to [d, 1, f] beside the up one's; XLA's h^T dgate, [d, f]). A
        transpose of sized dims with nothing under it to take it stays where it is, as
        simplify.py's layout rule leaves it."""
        r = self.producer.get(op.inputs[0])
        if r is None or r.kind != "reshape" or 1 in self.shape(r.inputs[0]):
            return False                  # (the operand's own size-1 dims: unit_dims_into_dot's)
        x, shape = r.inputs[0], self.shape(r.output)
        sized = [d for d in op.params["permutation"] if shape[d] != 1]
        dtype = self.g.tensors[op.output].dtype
        if sized != sorted(sized):
            under = self.producer.get(x)
            if [n for n in shape if n != 1] != list(self.shape(x)) or under is None \
                    or under.kind not in ("transpose", "dot_general"):
                return False              # (a transpose of regrouped dims, or with none to meet)
            rank = {d: i for i, d in enumerate(sorted(sized))}   # r's sized dim -> x's dim
            order = [rank[d] for d in sized]
            x = self.new_op("transpose", [x], _permuted(self.shape(x), order), dtype,
                            {"permutation": tuple(order)}, op)
        self.new_op("reshape", [x], self.shape(op.output), dtype, {}, op, output=op.output)
        return True

    def free_units_out_of_dot(self, op: Op) -> bool:
        """A dot operand reshape(x), x without size-1 dims, that regroups x's dims and
        inserts size-1 dims the dot keeps free, is read as reshape(x) to its sized dims
        alone: a free size-1 dim holds one position, so the dot's result differs by
        size-1 dims only and is reshaped to its shape (XLA's decoding step reads q as
        [b, h, 1, e]; the program's q is [b, h, e]). A reshape that only inserts or
        moves size-1 dims is simplify_moves.unit_moves_out_of_dot's."""
        if len(op.inputs) != 2:
            return False
        p = op.params
        for side, key, r in self.reshaped_operands(op):
            src, shape = self.shape(r.inputs[0]), self.shape(r.output)
            roles = set(p[f"{key}_batch"]) | set(p[f"{key}_contract"])
            sized = [d for d, n in enumerate(shape) if n != 1]
            if 1 in src or len(sized) == len(shape) or roles - set(sized) \
                    or tuple(shape[d] for d in sized) == src:
                continue
            at = {d: i for i, d in enumerate(sized)}
            u = self.new_op("reshape", [r.inputs[0]], tuple(shape[d] for d in sized),
                            self.g.tensors[r.output].dtype, {}, r)
            return self._dot_reading(op, side, key, u, at)
        return False

    def dot_of_free_concatenation(self, op: Op) -> bool:
        """dot(x, concat(a_i; k)), k a free dim of that operand, is concat(dot(x, a_i); j),
        j the result dim k becomes (rewrites.py's rule, which runs before the normal form;
        here for a concatenation the normal form exposes: XLA's fused gate/up weight
        gradient h^T concat(dgate, dup), whose concatenation the program's JAX lowering
        had split into one dot per piece). The concatenation keeps its own source, so
        pieces in the wrong order are reported where they were concatenated."""
        if len(op.inputs) != 2:
            return False
        p = op.params
        lrank, rrank = (len(self.shape(t)) for t in op.inputs)
        for side, cat, k, contract, batch in self._concat_operands(op):
            if k in contract or k in batch:
                continue
            j = _dot_out_dim(p, lrank, rrank, side, k)
            out = self.shape(op.output)
            dtype = self.g.tensors[op.output].dtype
            pieces = []
            for piece in cat.inputs:
                ins = [op.inputs[0], piece] if side else [piece, op.inputs[1]]
                shape = out[:j] + (self.shape(piece)[k],) + out[j + 1:]
                pieces.append(self.new_op("dot_general", ins, shape, dtype, p, op))
            self.new_op("concatenate", pieces, out, dtype, {"dimension": j}, cat, output=op.output)
            return True
        return False

    def unit_insertion_into_broadcast(self, op: Op) -> bool:
        """A broadcast_in_dim of a reshape that only inserts size-1 dims broadcasts the
        reshape's operand, its dims where the reshape's kept dims went: each inserted
        dim holds one position, which the broadcast repeats along its result dim as
        it repeats a new dim (the program's iota reshaped to [1, n] before its mask's
        broadcast; XLA broadcasts the iota)."""
        r = self.producer.get(op.inputs[0])
        if r is None or r.kind != "reshape":
            return False
        found = _unit_deletion(self.shape(r.output), self.shape(r.inputs[0]))
        if found is None:
            return False
        kept, _ = found
        q = dict(op.params)
        q["broadcast_dimensions"] = tuple(op.params["broadcast_dimensions"][i] for i in kept)
        self.new_op("broadcast_in_dim", [r.inputs[0]], self.shape(op.output),
                    self.g.tensors[op.output].dtype, q, op, output=op.output)
        return True

    def broadcast_under_unit_insertion(self, op: Op) -> bool:
        """A reshape that only inserts size-1 dims into a broadcast_in_dim is the
        broadcast to the reshape's shape, each dim where the reshape put it: an
        element of the result has the broadcast's element's coordinates, the inserted
        ones 0 (the program broadcasts a causal mask to [b, h, q, k] and reshapes it
        to [1, b, h, q, k] beside its scores; XLA broadcasts it there directly)."""
        b = self.producer.get(op.inputs[0])
        if b is None or b.kind != "broadcast_in_dim":
            return False
        found = _unit_deletion(self.shape(op.output), self.shape(b.output))
        if found is None:
            return False
        kept, _ = found
        q = dict(b.params)
        q["broadcast_dimensions"] = tuple(kept[d] for d in b.params["broadcast_dimensions"])
        self.new_op("broadcast_in_dim", list(b.inputs), self.shape(op.output),
                    self.g.tensors[op.output].dtype, q, op, output=op.output)
        return True

    # ------------------------------------------------------------------ dots
    def transposed_dot(self, op: Op) -> bool:
        """transpose(gathers(reshape(dot))) as gathers'(reshape'(dot')), the reshape and
        gathers optional (see the module docstring); False when no dot' computes it."""
        gathers: list[Op] = []
        d = self.producer.get(op.inputs[0])
        while d is not None and d.kind in ("all_gather", "collective_permute") and len(d.inputs) == 1:
            gathers.append(d)
            d = self.producer.get(d.inputs[0])
        r = None
        if d is not None and d.kind == "reshape":
            r, d = d, self.producer.get(d.inputs[0])
        if d is None or d.kind != "dot_general" or len(d.inputs) != 2:
            return False
        p = d.params
        lshape, rshape, dshape = (self.shape(t) for t in (*d.inputs, d.output))
        lb, rb, lc, rc = (list(p[k]) for k in ("lhs_batch", "rhs_batch", "lhs_contract",
                                                "rhs_contract"))
        lfree = [i for i in range(len(lshape)) if i not in lb and i not in lc]
        rfree = [i for i in range(len(rshape)) if i not in rb and i not in rc]
        nb, nl = len(lb), len(lfree)
        region = [0 if i < nb else 1 if i < nb + nl else 2 for i in range(len(dshape))]
        groups = [[i] for i in range(len(dshape))] if r is None else \
            _merge_groups(dshape, self.shape(r.output))
        if groups is None:
            return False
        greg = []      # a group's region: its sized dims' (size-1 dims go anywhere)
        for run in groups:
            regs = {region[i] for i in run if dshape[i] != 1} or {region[run[0]]}
            if len(regs) > 1:
                return False       # (a run merging dims of two regions: no dot computes it)
            greg.append(regs.pop())
        perm = list(op.params["permutation"])
        mid = self.shape(r.output) if r is not None else dshape
        if [g for g in perm if mid[g] != 1] == sorted(g for g in perm if mid[g] != 1):
            return False          # (moving size-1 dims only moves no element: nothing to take)
        # Size-1 dims hold one position: where a side puts one says nothing (XLA moves
        # a rank's batch of one to the front), so the sized free dims alone decide
        # the swap; each size-1 dim keeps its place among its region's dims.
        frees = [g for g in perm if greg[g] and mid[g] != 1]
        swap = bool(frees) and greg[frees[0]] == 2
        plan = swap, self._split_order(perm, greg, mid, swap, units_stay=True)
        partner = getattr(self, "partner_layouts", None)
        if partner is not None and not partner.holds(self._form_of(d, groups, region, mid, perm,
                                                                   *plan)):
            # where a rank's size-1 dim is the program's sized one, the transpose may read
            # the other operand's sized free dim first, or interleave the free dims by
            # that size-1 dim alone: the form the program's normal form holds
            # (dlverify/dot_orientation.py), when the default is none it holds
            others = [(s, self._split_order(perm, greg, mid, s, units_stay=False))
                      for s in (swap, not swap)] + [(swap, None)]
            plan = next((o for o in others if o != plan and partner.holds(
                self._form_of(d, groups, region, mid, perm, *o))), plan)
        swap, gorder = plan
        if gorder is None:
            return False
        whole = gorder == perm
        if not whole and self._composed_by_reader(
                op.output, {k for k, g in enumerate(perm) if greg[g] == 0}):
            return False    # (composed with its reader first: see the module docstring)
        residual = [gorder.index(g) for g in perm]      # the transpose left after dot'
        batch, left, right = self._regions_in(gorder, groups, region)
        order = batch + (right + left if swap else left + right)
        nc = len(lc)
        q = dict(p)
        q["lhs_batch"] = q["rhs_batch"] = tuple(range(nb))
        lhs_b, rhs_b = [lb[j] for j in batch], [rb[j] for j in batch]
        lhs_f, rhs_f = [lfree[j - nb] for j in left], [rfree[j - nb - nl] for j in right]
        # (splitting a transpose that interleaves the free dims re-orients the dot: an
        # operand that is a transpose already is then the layout the program wrote for
        # it, so the new transpose, which composes with it, takes its source and a wrong
        # permutation there is reported where it was written. Otherwise the outer
        # transpose's: its frames are the ones a fused dot without metadata is located
        # by, at its neighbours' shared frames, diagnosis_origin._shared_caller)
        interleaved = [g for g in perm if greg[g]] != [g for g in gorder if greg[g]]
        lsite, rsite = ((self._site_of_operand(t, op) if interleaved else op) for t in d.inputs)
        if swap:      # rhs first: its free dims in lhs position (batch, free, contracted)
            lhs = self._transposed(d.inputs[1], rhs_b + rhs_f + rc, rsite)
            rhs = self._transposed(d.inputs[0], lhs_b + lc + lhs_f, lsite)
            q["lhs_contract"] = tuple(range(len(rshape) - nc, len(rshape)))
        else:
            lhs = self._transposed(d.inputs[0], lhs_b + lhs_f + lc, lsite)
            rhs = self._transposed(d.inputs[1], rhs_b + rc + rhs_f, rsite)
            q["lhs_contract"] = tuple(range(len(lshape) - nc, len(lshape)))
        q["rhs_contract"] = tuple(range(nb, nb + nc))
        dtype = self.g.tensors[d.output].dtype
        steps: list[tuple[str, tuple[int, ...], dict, Op]] = []   # after the dot
        if r is not None and _permuted(self.shape(r.output), gorder) != _permuted(dshape, order):
            steps.append(("reshape", _permuted(self.shape(r.output), gorder), {}, r))
        for ga in reversed(gathers):
            g = dict(ga.params)
            if ga.kind == "all_gather":
                g["dimension"] = gorder.index(ga.params["dimension"])
            steps.append((ga.kind, _permuted(self.shape(ga.output), gorder), g, ga))
        # (at the dot's source: a failure there is the dot's, e.g. its partial sums)
        value = self.new_op("dot_general", [lhs, rhs], _permuted(dshape, order), dtype, q, d,
                            output=op.output if whole and not steps else None)
        for k, (kind, shape, params, like) in enumerate(steps):
            value = self.new_op(kind, [value], shape, dtype, params, like,
                                output=op.output if k == len(steps) - 1 and whole else None)
        if not whole:
            self.new_op("transpose", [value], self.shape(op.output), dtype,
                        {"permutation": tuple(residual)}, op, output=op.output)
        return True

    @staticmethod
    def _split_order(perm: list[int], greg: list[int], mid: tuple[int, ...],
                     swap: bool, units_stay: bool) -> list[int] | None:
        """The order of the groups of dims dot' computes (batch, the lhs' free, the
        rhs' free; the rhs' first when `swap`, each in P's order), or None when the
        transpose stays: dot' would be the dot itself, or (`units_stay`) P interleaves
        the free dims by a size-1 dim alone (its sized ones one operand's, then the
        other's: XLA's rank's one expert, a free dim there, which the program batches;
        the sides would order it differently in dot')."""
        gorder = [g for want in ((0, 2, 1) if swap else (0, 1, 2)) for g in perm
                  if greg[g] == want]
        free = [g for g in perm if greg[g]]
        by_units = free != [g for g in gorder if greg[g]] and [
            g for g in free if mid[g] != 1] == [g for g in gorder if greg[g] and mid[g] != 1]
        if gorder != perm and (units_stay and by_units or gorder == sorted(gorder)):
            return None
        return gorder

    @staticmethod
    def _regions_in(gorder: list[int], groups: list[list[int]],
                    region: list[int]) -> tuple[list[int], ...]:
        """The dot's dims region by region (batch, lhs free, rhs free), in their runs'
        order `gorder`."""
        return tuple([i for g in gorder for i in groups[g] if region[i] == want]
                     for want in (0, 1, 2))

    def _form_of(self, d: Op, groups: list[list[int]], region: list[int],
                 mid: tuple[int, ...], perm: list[int], swap: bool,
                 gorder: list[int] | None) -> Form:
        """The Form (dlverify/dot_orientation.py) the dot d transposed by perm takes
        with the plan (swap, gorder): dot' and the transpose left, or d and perm."""
        dshape = self.shape(d.output)
        lshape = self.shape(d.inputs[0])
        contract = tuple(lshape[k] for k in d.params["lhs_contract"])
        if gorder is None:
            return Form(dot_sizes(d.params, lshape, self.shape(d.inputs[1])), len(mid),
                        tuple(perm))
        batch, left, right = self._regions_in(gorder, groups, region)
        first, second = (right, left) if swap else (left, right)
        sizes = tuple(tuple(dshape[i] for i in dims) for dims in (batch, first, second))
        residual = tuple(gorder.index(g) for g in perm)
        return Form((*sizes, contract), len(mid),
                    None if residual == tuple(range(len(residual))) else residual)

    def readers(self, t: int) -> list[Op]:
        """The ops that read t as the pass began (a tensor made in this pass has none)."""
        if self._readers is None:
            self._readers = {}
            for o in self.g.ops:
                for i in o.inputs:
                    self._readers.setdefault(i, []).append(o)
        return self._readers.get(t, [])

    def _composed_by_reader(self, t: int, moved: set[int]) -> bool:
        """Whether t's readers (as the pass began) all take t's layout into their own:
        a transpose (composing the two), or a dot contracting one of t's dims `moved`
        (the dot's batch dims: where t puts a dim summed away is the reader's to say)
        in another operand order than simplify.dot_layout's (which composes the two).
        A reader taking t as it is (a dot in that order, any other op; an output)
        keeps t's layout whatever the others do (see the module docstring)."""
        readers = self.readers(t)
        return bool(readers) and t not in self.g.outputs and all(self._composes(o, t, moved) for o in readers)

    def _composes(self, o: Op, t: int, moved: set[int]) -> bool:
        """Whether reader `o` of t takes t's layout into its own (`_composed_by_reader`)."""
        if o.kind == "transpose":
            return True
        return o.kind == "dot_general" and len(o.inputs) == 2 and any(
            o.inputs[side] == t and moved & set(o.params[f"{key}_contract"])
            and not _standard_operand(o.params, key, len(self.shape(t)))
            for side, key in ((0, "lhs"), (1, "rhs")))

    def _site_of_operand(self, x: int, default: Op) -> Op:
        """The op whose source a transpose of x is reported at: x's own transpose, if
        x is one, else `default`."""
        p = self.producer.get(x)
        return p if p is not None and p.kind == "transpose" else default

    def _transposed(self, x: int, order: list[int], like: Op) -> int:
        """x transposed so that its dim k is x's dim order[k] (x itself for the identity)."""
        if order == list(range(len(order))):
            return x
        return self.new_op("transpose", [x], _permuted(self.shape(x), order),
                           self.g.tensors[x].dtype, {"permutation": tuple(order)}, like)

    def transpose_into_elementwise(self, op: Op) -> bool:
        """A transpose of an elementwise op of one tensor, splats (broadcasts of a
        scalar) and broadcasts of smaller tensors is the op of the transposed tensor and
        the splats and broadcasts at the new shape (each broadcast's dims where the
        transpose sends them, its operand transposed to keep them in order): the scaling
        XLA moves between a dot and its transpose (q k^T * 0.5, then transposed) does not
        keep the transpose from the dot, nor does RoPE's cos table broadcast into the
        layout XLA rotates q in ([b, g, s, j, d], then transposed to the program's
        [b, s, g, j, d]). With a broadcast table only when the transpose is the op's one
        reader: the op itself moves to the new layout, as no other reader keeps it in
        the old one (a bias added, then read by the next dot and transposed for a weight
        gradient, stays, as the side that gathers it before the transpose keeps it)."""
        e = self.producer.get(op.inputs[0])
        if e is None or KINDS[e.kind].family is not Family.ELEMENTWISE:
            return False
        # (scalar_of_splat: the _Simplifier's (dlverify/simplify.py), which this joins)
        scalars = [self.scalar_of_splat(t) for t in e.inputs]
        tables = [None if s is not None else self._broadcast_table(t) for t, s in zip(e.inputs, scalars)]
        if sum(1 for s, b in zip(scalars, tables) if s is None and b is None) != 1:
            return False
        if any(tables) and [o.output for o in self.readers(e.output)] != [op.output]:
            return False     # (a table's op read elsewhere too stays whole: a bias added
            # before a transposed weight gradient and the next layer's dot alike)
        perm = list(op.params["permutation"])
        shape = self.shape(op.output)
        ins = []
        for t, s, b in zip(e.inputs, scalars, tables):
            dtype = self.g.tensors[t].dtype
            if s is not None:
                ins.append(self.new_op("broadcast_in_dim", [s], shape, dtype,
                                       {"broadcast_dimensions": ()}, self.producer[t]))
            elif b is not None:
                dims = [perm.index(d) for d in b.params["broadcast_dimensions"]]
                order = sorted(range(len(dims)), key=dims.__getitem__)
                table = self._transposed(b.inputs[0], order, b)
                q = dict(b.params)
                q["broadcast_dimensions"] = tuple(sorted(dims))
                ins.append(self.new_op("broadcast_in_dim", [table], shape, dtype, q, b))
            else:
                ins.append(self._transposed(t, perm, op))
        self.new_op(e.kind, ins, shape, self.g.tensors[op.output].dtype, e.params, e,
                    output=op.output)
        return True

    def _broadcast_table(self, t: int) -> Op | None:
        """t's producer when it broadcasts a tensor of lower rank (not a scalar)."""
        b = self.producer.get(t)
        if b is None or b.kind != "broadcast_in_dim" or len(b.inputs) != 1:
            return None
        rank = len(self.shape(b.inputs[0]))
        return b if 0 < rank < len(self.shape(t)) else None

    # ------------------------------------------------- concatenations, slices
    def transpose_into_concatenate(self, op: Op) -> bool:
        """transpose(concat(x_i; k)) by P is concat(transpose(x_i) by P; P^-1(k)), also
        with collective_permutes between the two (each then takes the new concat)."""
        permutes: list[Op] = []      # (ring passes between: transpose(cp(x)) is cp(transpose(x)))
        cat = self.producer.get(op.inputs[0])
        while cat is not None and cat.kind == "collective_permute" and len(cat.inputs) == 1:
            permutes.append(cat)
            cat = self.producer.get(cat.inputs[0])
        if cat is None or cat.kind != "concatenate":
            return False
        perm = list(op.params["permutation"])
        dtype = self.g.tensors[op.output].dtype
        pieces = [self._transposed(x, perm, op) for x in cat.inputs]
        q = dict(cat.params)
        q["dimension"] = perm.index(cat.params["dimension"])
        value = self.new_op("concatenate", pieces, self.shape(op.output), dtype, q, cat,
                            output=None if permutes else op.output)
        for k, cp in enumerate(reversed(permutes)):
            value = self.new_op("collective_permute", [value], self.shape(op.output), dtype, cp.params,
                                cp, output=op.output if k == len(permutes) - 1 else None)
        return True

    def transpose_into_slice(self, op: Op) -> bool:
        """A transpose of a slice (of a dynamic slice) is the slice (dynamic slice) of the
        transpose, its bounds and strides (starts and sizes) permuted alike."""
        s = self.producer.get(op.inputs[0])
        if s is None or s.kind not in ("slice", "dynamic_slice"):
            return False
        perm = list(op.params["permutation"])
        if s.kind == "dynamic_slice" and len(s.inputs) != 1 + len(perm):
            return False        # (a dynamic slice whose starts are one index vector)
        x = self._transposed(s.inputs[0], perm, op)
        dtype = self.g.tensors[op.output].dtype
        if s.kind == "slice":
            q = {k: (None if s.params.get(k) is None else _permuted(s.params[k], perm))
                 for k in ("start_indices", "limit_indices", "strides")}
            self.new_op("slice", [x], self.shape(op.output), dtype, q, s, output=op.output)
            return True
        starts = _permuted(s.inputs[1:], perm)
        q = dict(s.params)
        q["slice_sizes"] = _permuted(s.params["slice_sizes"], perm)
        self.new_op("dynamic_slice", [x, *starts], self.shape(op.output), dtype, q, s,
                    output=op.output)
        return True


__all__ = ["_LayoutRules"]
