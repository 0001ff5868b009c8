"""Exact IR rewrites run on both graphs before export.

Each rewrite replaces ops by ops that compute the same value for every input
(an identity of real arithmetic and data movement, not an approximation or an
assumption), so that the rules, which relate one op to one op, meet the
pieces of a value that one side builds whole:

* dot through concatenate: when an operand of a dot_general is a
  concatenate along one of that operand's free dims (neither contracted nor
  batch),

      dot(x, concat(a, b, c; k)) = concat(dot(x, a), dot(x, b), dot(x, c); j)

  with j the output dim of operand dim k (the same on the lhs side). This is
  how a fused QKV weight meets its segments: `dlverify.spec.hlo_problem`
  represents a segmented parameter as a concatenate of per-segment inputs on
  both sides, and the distributed product then holds its Q, K and V parts
  side by side without being one block of the sequential product.

* dot through a concatenate along a contracted dim: the sum of the pieces'
  dots with the matching slices of the other operand,

      dot(concat(a, b; k), w) = dot(a, w[:n_a]) + dot(b, w[n_a:])     (k contracted)

  and, when a summing all_reduce or reduce_scatter is the product's only reader
  (distributed side), the sum of the pieces' collectives. A fused QKV projection's
  input gradient contracts the concatenation of dq, dk and dv; with fewer KV heads
  than ranks each rank's dk and dv are partial sums of two different reductions, which
  then complete on their own. (Programs as written; compiled modules keep the fused
  contraction for their normal form, dlverify/simplify.py, and split it after it only
  where the two programs disagree: split_contracted_concatenations.)

* all-reduce of concatenate (or of its transpose): the concatenate of the pieces'
  all-reduces (the reduction is position by position), for the same reason.

* slice of concatenate: a unit-stride slice of a concatenate along dim k is
  the concatenate of the slices of the operands it overlaps, each sliced to
  the overlap (an operand covered whole and not cut in any other dim is used
  as it is; one operand alone needs no concatenate):

      slice(concat(a, b, c; k), [off_b : off_c) in k) = b

* pad of transpose: transpose(pad(x)) with the padding config moved to x's dims
  (pads move to the layout the program pads in; XLA transposes a convolution's
  operand to its preferred layout and pads there).

* all-gather of concatenate: an all-gather along dim a of a concatenate along
  another dim k is the concatenate along k of the pieces' all-gathers along a
  (each member's pieces land at the same offsets of a either way):

      all_gather(concat(a, b; k); a) = concat(all_gather(a; a), all_gather(b; a); k)

  XLA's partitioner concatenates a fused QKV cotangent's local pieces, then
  gathers it (FSDP); the dot through concatenate above then meets the
  sequential product's pieces.

Ops that a rewrite leaves without consumers (the replaced concatenate, a
product whose slices now read the pieces) are removed; ops that had no
consumers before are kept as they were.
"""
from __future__ import annotations

from collections import Counter

from dlverify.ir import FoldedOp, Graph, GraphBuilder, IdAllocator, Op


class _Rewriter:
    # whether dots over a contracted concatenation are split (dot_contracted): programs
    # as written; compiled modules keep them whole, their normal form (simplify.py)
    # pairs the fused contractions XLA writes (then _ContractedSplit)
    split_contracted = False

    def __init__(self, graph: Graph, ids: IdAllocator) -> None:
        self.g = graph
        self.ids = ids
        self.out: list[Op] = []
        # new ops go to `out` (the graph's next op list), their tensors to the graph
        self.builder = GraphBuilder(Graph(graph.name, tensors=graph.tensors, ops=self.out), ids)
        self.producer: dict[int, Op] = {}
        self.alias: dict[int, int] = {}   # tensor -> the tensor now holding its value
        # collectives a rewrite replaced together with their operand's producer
        self.replaced: set[int] = set()
        self._summed_by: dict[int, Op] | None = None   # (dot_contracted's, once per pass)

    def new_op(self, kind: str, inputs: list[int], shape: tuple[int, ...], dtype: str,
               params: dict, like: Op, output: int | None = None) -> int:
        """An op computing like `like` (its source and name), into a new tensor or `output`."""
        output = self.builder.op(kind, inputs, shape, dtype, params, like.loc, like.name, output)
        self.producer[output] = self.out[-1]
        return output

    def shape(self, t: int) -> tuple[int, ...]:
        return self.g.tensors[t].shape

    def reshaped_operands(self, op: Op):
        """(side, key, reshape) for each operand of dot `op` (lhs first) a reshape produces."""
        for side, key in ((0, "lhs"), (1, "rhs")):
            r = self.producer.get(op.inputs[side])
            if r is not None and r.kind == "reshape":
                yield side, key, r

    def fold(self, op: Op, value: int) -> bool:
        """`op`'s result is tensor `value`: alias it, and keep the op for diagnosis."""
        self.alias[op.output] = value
        self.g.folded.append(FoldedOp(op.kind, op.loc, value))
        return True

    # ------------------------------------------------------------------ dot
    def _concat_operands(self, op: Op):
        """The operands of dot `op` that are concatenates (rhs first): (side, the
        concatenate, its dim, the dot's contracted dims and batch dims of that side)."""
        p = op.params
        for side, t in ((1, op.inputs[1]), (0, op.inputs[0])):
            cat = self.producer.get(t)
            if cat is not None and cat.kind == "concatenate" and len(cat.inputs) >= 2:
                key = "rhs" if side else "lhs"
                yield side, cat, cat.params["dimension"], p[f"{key}_contract"], p[f"{key}_batch"]

    def dot(self, op: Op) -> bool:
        p = op.params
        lhs, rhs = op.inputs
        for side, cat, k, contract, batch in self._concat_operands(op):
            if k in contract or k in batch:
                continue
            j = _dot_out_dim(p, len(self.shape(lhs)), len(self.shape(rhs)), side, k)
            out_shape = self.shape(op.output)
            dtype = self.g.tensors[op.output].dtype
            pieces = []
            for piece in cat.inputs:
                ins = [lhs, piece] if side else [piece, rhs]
                sh = out_shape[:j] + (self.shape(piece)[k],) + out_shape[j + 1:]
                pieces.append(self.new_op("dot_general", ins, sh, dtype, p, op))
            self.new_op("concatenate", pieces, out_shape, dtype, {"dimension": j}, op,
                        output=op.output)
            return True
        return False

    def dot_contracted(self, op: Op) -> bool:
        """A dot whose operand is a concatenate along a contracted dim: the sum of the
        pieces' dots with the matching slices of the other operand; under a summing
        all_reduce or reduce_scatter that is its only reader (distributed side), the sum
        of the pieces' collectives, each piece's partial terms complete on their own."""
        p = op.params
        lhs, rhs = op.inputs
        for side, cat, k, contract, _ in self._concat_operands(op):
            if k not in contract:
                continue
            other = lhs if side else rhs
            other_k = (p["lhs_contract"] if side else p["rhs_contract"])[list(contract).index(k)]
            out_shape, dtype = self.shape(op.output), self.g.tensors[op.output].dtype
            if self._summed_by is None:
                self._summed_by = _summed_by(self.g)
            psum = self._summed_by.get(op.output)
            terms, off = [], 0
            for piece in cat.inputs:
                n = self.shape(piece)[k]
                osh = list(self.shape(other))
                start = [0] * len(osh)
                start[other_k], osh[other_k] = off, n
                limit = [a + b for a, b in zip(start, osh)]
                sl = self.new_op("slice", [other], tuple(osh), self.g.tensors[other].dtype,
                                 {"start_indices": tuple(start), "limit_indices": tuple(limit),
                                  "strides": None}, op)
                term = self.new_op("dot_general", [sl, piece] if side else [piece, sl], out_shape,
                                   dtype, p, op)
                if psum is not None:
                    term = self.new_op(psum.kind, [term], self.shape(psum.output), dtype,
                                       psum.params, psum)
                terms.append(term)
                off += n
            acc = terms[0]
            target = psum.output if psum is not None else op.output
            for i, term in enumerate(terms[1:], 2):
                acc = self.new_op("add", [acc, term], self.shape(target), dtype, {}, op,
                                  output=target if i == len(terms) else None)
            if psum is not None:
                self.replaced.add(psum.id)
            return True
        return False

    # ------------------------------------------------------------------ slice
    def slice(self, op: Op) -> bool:
        p = op.params
        if p.get("strides") and any(s != 1 for s in p["strides"]):
            return False
        cat = self.producer.get(op.inputs[0])
        if cat is None or cat.kind != "concatenate":
            return False
        k = cat.params["dimension"]
        starts, limits = list(p["start_indices"]), list(p["limit_indices"])
        lo, hi = starts[k], limits[k]
        if lo >= hi:
            return False
        dtype = self.g.tensors[op.output].dtype
        pieces = []
        off = 0
        for t in cat.inputs:
            size = self.shape(t)[k]
            a, b = max(lo, off), min(hi, off + size)
            if a < b:
                st = starts[:k] + [a - off] + starts[k + 1:]
                li = limits[:k] + [b - off] + limits[k + 1:]
                full = all(s == 0 for s in st) and tuple(li) == self.shape(t)
                if full:
                    pieces.append(t)
                else:
                    sh = tuple(e - s for s, e in zip(st, li))
                    pieces.append(self.new_op("slice", [t], sh, dtype,
                                              {"start_indices": tuple(st), "limit_indices": tuple(li),
                                               "strides": None}, op))
            off += size
        if len(pieces) == 1 and pieces[0] in cat.inputs:
            self.fold(op, pieces[0])
        elif len(pieces) == 1:
            # the one piece is a fresh slice: let it produce the original output
            new = self.out.pop()
            del self.g.tensors[new.output]
            del self.producer[new.output]
            new.output = op.output
            self.out.append(new)
            self.producer[op.output] = new
        else:   # (reported as the program's concatenate, of which it is a part)
            self.new_op("concatenate", pieces, self.shape(op.output), dtype, {"dimension": k}, cat,
                        output=op.output)
        return True

    # ------------------------------------------------------------------ pad
    def pad(self, op: Op) -> bool:
        """pad(transpose(x)) is transpose(pad(x)) with the padding moved to x's dims:
        pads move toward the program's own layout, where a halo exchange pads or
        concatenates (XLA transposes a convolution's operand to its preferred layout
        first; the program as written pads in its own)."""
        t = self.producer.get(op.inputs[0])
        if t is None or t.kind != "transpose":
            return False
        perm = t.params["permutation"]
        cfg = [None] * len(perm)
        for j, p in enumerate(perm):
            cfg[p] = tuple(op.params["padding_config"][j])
        x = t.inputs[0]
        shape = tuple(lo + (n - 1) * (it + 1) + 1 + hi if n else lo + hi
                      for n, (lo, hi, it) in zip(self.shape(x), cfg))
        dtype = self.g.tensors[op.output].dtype
        padded = self.new_op("pad", [x, op.inputs[1]], shape, dtype, {"padding_config": tuple(cfg)}, op)
        self.new_op("transpose", [padded], self.shape(op.output), dtype, {"permutation": perm}, t,
                    output=op.output)
        return True

    # ------------------------------------------------------------ all_gather
    def all_gather(self, op: Op) -> bool:
        cat = self.producer.get(op.inputs[0])
        if cat is None or cat.kind != "concatenate" or len(cat.inputs) < 2:
            return False
        k, a = cat.params["dimension"], op.params["dimension"]
        if k == a:   # gathering along the concatenated dim interleaves the pieces
            return False
        dtype = self.g.tensors[op.output].dtype
        n = self.shape(op.output)[a] // self.shape(cat.output)[a] if self.shape(cat.output)[a] else 0
        if n == 0:
            return False
        pieces = [self.new_op("all_gather", [t], tuple(s * n if d == a else s
                                                       for d, s in enumerate(self.shape(t))),
                              dtype, op.params, op) for t in cat.inputs]
        self.new_op("concatenate", pieces, self.shape(op.output), dtype, cat.params, cat,
                    output=op.output)
        return True

    # ------------------------------------------------------------ all_reduce
    def all_reduce(self, op: Op, through_transpose: bool = True) -> bool:
        """An all_reduce of a concatenate (or, `through_transpose`, of its transpose) is the
        concatenate (its transpose) of the pieces' all_reduces: the reduction is position
        by position. The pieces' partial terms of different reductions then complete on
        their own (a fused QKV weight's gradient concatenated from its Q, K and V dots).
        The normal form (simplify.py) takes the concatenate only: it moves transposes
        into all_reduces itself."""
        x = self.producer.get(op.inputs[0])
        tr = x if through_transpose and x is not None and x.kind == "transpose" else None
        cat = self.producer.get(tr.inputs[0]) if tr is not None else x
        if cat is None or cat.kind != "concatenate":
            return False
        dtype = self.g.tensors[op.output].dtype
        pieces = [self.new_op("all_reduce", [t], self.shape(t), self.g.tensors[t].dtype, op.params, op)
                  for t in cat.inputs]
        if tr is None:
            self.new_op("concatenate", pieces, self.shape(op.output), dtype, cat.params, cat,
                        output=op.output)
        else:
            joined = self.new_op("concatenate", pieces, self.shape(cat.output), dtype, cat.params, cat)
            self.new_op("transpose", [joined], self.shape(op.output), dtype, tr.params, tr,
                        output=op.output)
        return True

    # ------------------------------------------------------------------ driver
    def apply(self, op: Op) -> bool:
        """Replace `op` by what a rule rewrites it into (True), or leave it (False)."""
        return (op.kind == "dot_general" and len(op.inputs) == 2
                and (self.dot(op) or self.split_contracted and self.dot_contracted(op))) or \
            (op.kind == "all_reduce" and len(op.inputs) == 1 and self.all_reduce(op)) or \
            (op.kind == "slice" and self.slice(op)) or \
            (op.kind == "pad" and self.pad(op)) or \
            (op.kind == "all_gather" and len(op.inputs) == 1 and self.all_gather(op))

    def run(self) -> bool:
        g = self.g
        unused_before = _unused(g)
        changed = False
        for op in g.ops:
            op.inputs = [self.alias.get(i, i) for i in op.inputs]
            if op.id in self.replaced:   # computed by the rewrite of its operand's producer
                changed = True
                continue
            if self.apply(op):
                changed = True
                continue
            self.out.append(op)
            self.producer[op.output] = op
        if not changed:
            return False
        g.outputs = [self.alias.get(t, t) for t in g.outputs]
        g.ops = self.out
        _drop_newly_dead(g, unused_before)
        return True


def _dot_out_dim(p: dict, lhs_rank: int, rhs_rank: int, side: int, k: int) -> int:
    """Output position of free dim k of operand `side` (0 lhs, 1 rhs): batch dims
    first, then the lhs free dims, then the rhs free dims, each in order."""
    j = len(p["lhs_batch"])
    lhs_free = [i for i in range(lhs_rank) if i not in p["lhs_contract"] and i not in p["lhs_batch"]]
    if side == 0:
        return j + lhs_free.index(k)
    rhs_free = [i for i in range(rhs_rank) if i not in p["rhs_contract"] and i not in p["rhs_batch"]]
    return j + len(lhs_free) + rhs_free.index(k)


def _summed_by(g: Graph) -> dict[int, Op]:
    """Tensor -> the summing all_reduce or reduce_scatter that is its only reader (and no
    output)."""
    uses = _uses(g)
    return {op.inputs[0]: op for op in g.ops
            if (op.kind == "all_reduce" and op.params.get("reducer") == "sum"
                or op.kind == "reduce_scatter" and op.params.get("reducer", "sum") == "sum")
            and len(op.inputs) == 1 and uses[op.inputs[0]] == 1 and op.inputs[0] not in g.outputs}


def _uses(g: Graph) -> Counter:
    c: Counter = Counter()
    for op in g.ops:
        c.update(op.inputs)
    c.update(g.outputs)
    return c


def _unused(g: Graph) -> set[int]:
    """Tensors of g that no op reads and no output is."""
    uses = _uses(g)
    return {t for t in g.tensors if uses[t] == 0}


def _drop_newly_dead(g: Graph, unused_before: set[int]) -> None:
    """Remove ops whose output is used no more, except those already unused before
    the rewrite (a rewrite never removes what the program itself left dead)."""
    # One pass with use counts (removing a dead op may leave its producers dead: a
    # worklist, not a rescan of the graph per removed op).
    uses = _uses(g)
    producer = {op.output: op for op in g.ops}
    dead: set[int] = set()
    work = [op for op in g.ops if uses[op.output] == 0 and op.output not in unused_before]
    while work:
        op = work.pop()
        if op.id in dead:
            continue
        dead.add(op.id)
        for t in op.inputs:
            uses[t] -= 1
            p = producer.get(t)
            if uses[t] == 0 and t not in unused_before and p is not None:
                work.append(p)
    if dead:
        g.ops = [op for op in g.ops if op.id not in dead]
    # (a tensor with no producer that is still read is a scan summary's placeholder,
    # dlverify/induction.py)
    produced = set(g.inputs) | {op.output for op in g.ops} | {t for t, n in uses.items() if n > 0}
    for t in [t for t in g.tensors if t not in produced]:
        del g.tensors[t]


def rewrite_graph(graph: Graph, ids: IdAllocator, split_contracted: bool = True) -> bool:
    """Apply the rewrites until none applies (dots over a contracted concatenation split
    only when `split_contracted`). Returns whether anything changed."""
    changed = False
    while True:
        rw = _Rewriter(graph, ids)
        rw.split_contracted = split_contracted
        if not rw.run():
            return changed
        changed = True


class _ContractedSplit(_Rewriter):
    """dot_contracted, and the slices it makes of a concatenate (the other operand's,
    when that is a concatenate too), for compiled modules after their normal form; in
    the pieces' dots a contracted pair of size-1 dims is dropped (a sum over one index:
    a piece of size 1 along the concatenated dim contracts nothing along it)."""
    split_contracted = True

    def __init__(self, graph: Graph, ids: IdAllocator, pieces: set[int],
                 fused: set[tuple]) -> None:
        super().__init__(graph, ids)
        self.pieces = pieces        # outputs of the dots and slices the split made (every run's)
        self.fused = fused          # the other program's _fused_dots: those stay fused

    def new_op(self, kind: str, inputs: list[int], shape: tuple[int, ...], dtype: str,
               params: dict, like: Op, output: int | None = None) -> int:
        out = super().new_op(kind, inputs, shape, dtype, params, like, output)
        if kind in ("dot_general", "slice") and like.kind == "dot_general":
            self.pieces.add(out)
        return out

    def apply(self, op: Op) -> bool:
        if op.kind == "dot_general" and len(op.inputs) == 2:
            pieces = _fused_pieces(self.g, self.producer, op)
            return pieces is not None and not self.fused & set(pieces) and self.dot_contracted(op) \
                or op.output in self.pieces and self.unit_pair(op)
        return op.kind == "slice" and op.output in self.pieces and self.slice(op)

    def unit_pair(self, op: Op) -> bool:
        """dot(x, y) contracting size-1 dims i of x and j of y: the dot of x and y with
        those dims deleted (reshapes), the other dims renumbered."""
        p = op.params
        shapes = [self.shape(t) for t in op.inputs]
        pairs = [(i, j) for i, j in zip(p["lhs_contract"], p["rhs_contract"])
                 if shapes[0][i] == 1 and shapes[1][j] == 1]
        if not pairs:
            return False
        drop = ({i for i, _ in pairs}, {j for _, j in pairs})
        ins = []
        for t, sh, gone in zip(op.inputs, shapes, drop):
            kept = tuple(n for d, n in enumerate(sh) if d not in gone)
            ins.append(self.new_op("reshape", [t], kept, self.g.tensors[t].dtype, {}, op))
        def renum(dims, gone):
            return tuple(d - sum(g < d for g in gone) for d in dims if d not in gone)
        q = dict(p)
        for key, gone in (("lhs", drop[0]), ("rhs", drop[1])):
            q[f"{key}_contract"] = renum(p[f"{key}_contract"], gone)
            q[f"{key}_batch"] = renum(p[f"{key}_batch"], gone)
        self.new_op("dot_general", ins, self.shape(op.output), self.g.tensors[op.output].dtype, q,
                    op, output=op.output)
        return True


def _fused_pieces(g: Graph, producer: dict[int, Op], op: Op) -> tuple | None:
    """When dot `op` contracts a concatenation of different values (no operand's pieces
    all slices of one tensor, _sliced_from: micro-batches of one batch, which
    simplify_accumulate.py merges as the program's one contraction), the pieces' sizes
    along the concatenated
    dims (lhs, rhs; None for an operand that is no such concatenation); else None. An
    all_gather along a contracted dim counts as the concatenation of its members'
    pieces (_gathered_pieces): the other program's concatenation of pieces of those
    sizes then stays fused, as its all_gather does."""
    sizes: list[tuple[int, ...] | None] = [None, None]
    for side, (t, key) in enumerate(zip(op.inputs, ("lhs", "rhs"))):
        cat = producer.get(t)
        gathered = _gathered_pieces(g, cat)
        if gathered is not None:   # (a concatenation across ranks: never split itself)
            if gathered[0] in op.params[f"{key}_contract"]:
                sizes[side] = gathered[1]
            continue
        if cat is None or cat.kind != "concatenate":
            continue
        if _sliced_from(producer, t) is not None:
            return None
        k = cat.params["dimension"]
        if k in op.params[f"{key}_contract"]:
            sizes[side] = tuple(g.tensors[i].shape[k] for i in cat.inputs)
    return None if sizes == [None, None] else tuple(sizes)


def _gathered_pieces(g: Graph, op: Op | None) -> tuple[int, tuple[int, ...]] | None:
    """(gathered dim, the pieces' sizes along it) when op is an all_gather: the
    members' blocks concatenated in group order, as a program that concatenates the
    same pieces itself holds them (a sequential prefix sum's block totals as rows,
    dlverify/blocked_scan.py, against their all_gather)."""
    if op is None or op.kind != "all_gather" or not op.params.get("groups"):
        return None
    k = int(op.params["dimension"])
    return k, (g.tensors[op.inputs[0]].shape[k],) * len(op.params["groups"][0])


def _sliced_from(producer: dict[int, Op], t: int) -> int | None:
    """The tensor t is a slice of, or a concatenation of slices of (perhaps nested: an
    accumulation of three micro-batches and more); None when there is no one such."""
    op = producer.get(t)
    if op is not None and op.kind in ("slice", "dynamic_slice"):
        return op.inputs[0]
    if op is None or op.kind != "concatenate":
        return None
    srcs = {_sliced_from(producer, i) for i in op.inputs}
    return srcs.pop() if len(srcs) == 1 else None


def _fused_dots(g: Graph) -> set[tuple]:
    """The pieces' sizes of the concatenations g's dots contract (_fused_pieces), of
    either operand: one a ring passes on to a dot through a collective is that dot's
    operand no more (the rotated halves of a rotary q k^T)."""
    producer = g.producer()
    found = (_fused_pieces(g, producer, op) for op in g.ops
             if op.kind == "dot_general" and len(op.inputs) == 2)
    return {sizes for f in found if f is not None for sizes in f if sizes is not None}


def split_contracted_concatenations(seq: Graph, dist: Graph, ids: IdAllocator) -> list[Graph]:
    """Compiled modules' dots over a contracted concatenation of different values as
    the sums of the pieces' dots (_Rewriter.dot_contracted; under a psum, the pieces'
    psums), in both programs, where their normal forms disagree: a program's dot no
    concatenation of whose (_fused_pieces) the other program's dots contract in pieces
    of the same sizes, where the other adds dots (simplify_accumulate.py merges dK wk_r^T + dV wv_r^T of a rank's
    one KV head, whose size-1 head dims read as micro-batches; the program's two KV
    heads have none). Where both fuse alike they stay fused. Returns the graphs changed."""
    fused = [_fused_dots(g) for g in (seq, dist)]
    changed = []
    for g, other in ((seq, fused[1]), (dist, fused[0])):
        pieces: set[int] = set()
        if _ContractedSplit(g, ids, pieces, other).run():
            changed.append(g)
            while _ContractedSplit(g, ids, pieces, other).run():
                pass
    return changed
