"""Where what is wrong with a distributed value first appears (for dlverify/diagnosis.py).

A value with a partial tag was made partial by one op (a contraction over a split
dim, a masked update); a value that is c times its sequential counterpart got the
factor c from one op (a division by the wrong world size, a second division, a
missing one). Linear ops carry the tag or the factor along unchanged, so the
first op on the way back whose operands do not carry it is where it entered: the
line to fix, rather than the output or the first nonlinear op (a square root, an
exponential) where the mismatch is finally seen.
"""
from __future__ import annotations

from dataclasses import dataclass

from dlverify.ir import Op, SourceLoc
from dlverify.verdict import UNIT_SCALE, ViewFact


@dataclass(frozen=True)
class RescaledSum:
    """`op` (a product or division by a literal) turns the result of `collective`,
    held as `summed`, into `made`: still a multiple of the sequential value."""

    op: Op
    collective: Op
    summed: ViewFact
    made: ViewFact


@dataclass(frozen=True)
class UnscaledSum:
    """`collective` sums partial terms each held as `terms` (a multiple of the
    sequential terms) into `made`, and nothing after it divides the sum."""

    collective: Op
    terms: ViewFact
    made: ViewFact


def origin(dist_prod: dict[int, Op], by_dist: dict[tuple[int, int], list[ViewFact]], d: int,
           r: int, vs: list[ViewFact]) -> Op | None:
    """The distributed op where what is wrong with d's first view on rank r first
    appears: the op that created its partial tag, or that introduced its factor
    through operands holding the same sequential value (earliest_origin follows
    factors further, through the values the sequential one is computed from)."""
    if not vs:
        return dist_prod.get(d)
    found = walk(dist_prod, by_dist, d, r, vs[0], None)
    return found[0] if found else dist_prod.get(d)


def walk(dist_prod: dict[int, Op], by_dist: dict[tuple[int, int], list[ViewFact]], d: int,
         r: int, v: ViewFact, seq_prod: dict[int, Op] | None,
         path: list[tuple[Op, ViewFact, ViewFact]] | None = None) -> tuple[Op, ViewFact] | None:
    """The walk back from d's view v: the op found and its result's view it followed.
    A factor is followed through an operand holding the same sequential value with a
    factor, or (with `seq_prod`, the sequential producers) a value the sequential one
    is computed from with a factor of its own, as a product multiplies them; an op
    whose operands hold those values unscaled introduced it. `path` collects each op
    passed, its result's view and the operand's view followed."""
    t, seen = d, set()
    while t in dist_prod and t not in seen:
        seen.add(t)
        op = dist_prod[t]
        # an operand holding the same sequential value first, else one it is computed from
        carried = min(((w.seq != v.seq, k, i, w) for k, i in enumerate(op.inputs)
                       for w in by_dist.get((i, r), []) if _carries(v, w, seq_prod)),
                      key=lambda c: c[:2], default=None)
        if carried is None:
            return op, v
        _, _, t, w = carried
        if path is not None:
            path.append((op, v, w))
        if v.partial is None:   # follow the factor as the operand's view holds it
            v = w
    return None


def _carries(v: ViewFact, w: ViewFact, seq_prod: dict[int, Op] | None) -> bool:
    """Operand view w carries what is wrong with the result's view v."""
    if v.partial is not None:
        return w.partial == v.partial
    if v.scale == UNIT_SCALE or w.partial is not None or w.scale == UNIT_SCALE:
        return False
    if w.seq == v.seq:   # another factor too: a literal product one side only moved it
        return True
    return seq_prod is not None and _upstream(seq_prod, w.seq, v.seq)


def _upstream(seq_prod: dict[int, Op], a: int, b: int, limit: int = 64) -> bool:
    """Sequential tensor a is among the values b is computed from, within `limit` ops
    back (the programs may group a computation differently: an add of a zero one side
    folds away, a literal factor is applied before or after a product)."""
    todo, seen = [b], {b}
    while todo and len(seen) <= limit:
        op = seq_prod.get(todo.pop())
        for i in op.inputs if op is not None else ():
            if i == a:
                return True
            if i not in seen:
                seen.add(i)
                todo.append(i)
    return False


def earliest_origin(dist_prod: dict[int, Op], by_dist: dict[tuple[int, int], list[ViewFact]],
                    seq_prod: dict[int, Op], order: dict[int, int], d: int, r: int,
                    vs: list[ViewFact]) -> tuple[Op, ViewFact] | None:
    """Of the origins of d's views `vs` on rank r, the earliest in program order, with
    its view. A value d relates to several sequential tensors with several factors (a
    division by a literal both programs make moves the factor onto the quotient); the
    earliest origin is where the factor that stays wrong entered. Only origins that
    make the factor themselves count (introduces_factor). Returns the op and the view
    of its result the walk reached."""
    found = [ov for v in vs if (ov := walk(dist_prod, by_dist, d, r, v, seq_prod)) is not None
             and (v.partial is not None or introduces_factor(by_dist, ov[0], r))]
    return min(found, key=lambda ov: order[ov[0].id]) if found else None


def scaled_operand(by_dist: dict[tuple[int, int], list[ViewFact]], op: Op,
                   r: int) -> tuple[int, list[ViewFact]] | None:
    """An operand of `op` that every view on rank r relates as a whole block scaled by
    a factor other than 1 (and no view relates unscaled), when every operand has
    views: the frontier is then a nonlinear op reading a value off by a constant
    factor. Returns the operand's position and its views."""
    found = None
    for pos, t in enumerate(op.inputs):
        vs = by_dist.get((t, r), [])
        if not vs:
            return None
        if found is None and all(v.partial is None and v.scale != UNIT_SCALE for v in vs):
            found = (pos, vs)
    return found


def introduces_factor(by_dist: dict[tuple[int, int], list[ViewFact]], op: Op, r: int) -> bool:
    """No operand of `op` holds only partial sums on rank r (literals hold none): the
    factor its result carries was made by the op itself (a one-sided division or
    product), the line to fix. A collective completing partial sums that bring a
    factor along (local means summed over the ranks) is not: the fix is the division
    after it, missing (unscaled_sum) or by the wrong amount (rescaled_sums)."""
    for i in op.inputs:
        vs = by_dist.get((i, r), [])     # none: a literal
        if vs and all(w.partial is not None for w in vs):
            return False
    return True


def unscaled_sum(dist_prod: dict[int, Op], by_dist: dict[tuple[int, int], list[ViewFact]],
                 seq_prod: dict[int, Op], d: int, r: int,
                 vs: list[ViewFact]) -> UnscaledSum | None:
    """The collective completing partial sums whose terms already carry d's factor
    (local means summed over the ranks), reached back from d's views `vs` on rank r
    (walk): no op after the collective fixes the factor, so the division belongs
    right after it, the line to fix. (A compiled module puts other ops between the
    collective and the output: XLA splits one all-reduce into column blocks joined by
    a concatenate, or adds a bitcast; their metadata names lines that have nothing
    to do with the factor.) Every op on the way must pass the factor on: a
    collective there (summing complete copies multiplies by the group size), or an
    op giving the same sequential value another factor with a literal only the
    distributed program has (no view: a division the user wrote, rescaled_sums'
    case), fixes the factor after the collective by the wrong amount, so it is not
    missing. A product of values with views may change it (g * g squares it; a
    literal both programs apply, grouped otherwise, moves it).
    Returns the collective with a view of its operand's terms and of its result."""
    def passes(op: Op, res: ViewFact, opnd: ViewFact) -> bool:
        if op.kind in ("all_reduce", "reduce_scatter"):
            return False
        return res.seq != opnd.seq or res.scale == opnd.scale or all(
            by_dist.get((i, r)) for i in op.inputs)

    for v in (v for v in vs if v.partial is None):
        path: list[tuple[Op, ViewFact, ViewFact]] = []
        found = walk(dist_prod, by_dist, d, r, v, seq_prod, path)
        if found is None or not all(passes(*step) for step in path):
            continue
        op, at = found
        if op.kind not in ("all_reduce", "reduce_scatter") or introduces_factor(by_dist, op, r):
            continue
        terms = [w for i in op.inputs for w in by_dist.get((i, r), [])
                 if w.partial is not None and w.scale == at.scale]
        if terms:
            return UnscaledSum(op, terms[0], at)
    return None


def _scaled_upstream(dist_prod: dict[int, Op], by_dist: dict[tuple[int, int], list[ViewFact]],
                     t: int, r: int) -> set[int]:
    """t and the values it is computed from through values held scaled on rank r (whole
    blocks times a factor other than 1): the region the factor travels in."""
    def scaled(x: int) -> bool:
        return any(v.partial is None and v.scale != UNIT_SCALE for v in by_dist.get((x, r), []))

    upstream, todo = {t}, [t]
    while todo:
        op = dist_prod.get(todo.pop())
        for i in op.inputs if op is not None else ():
            if i not in upstream and scaled(i):
                upstream.add(i)
                todo.append(i)
    return upstream


def rescaled_sums(dist_prod: dict[int, Op], consumers: dict[int, list[Op]],
                  by_dist: dict[tuple[int, int], list[ViewFact]], t: int,
                  r: int) -> list[RescaledSum]:
    """The products and divisions by a literal that t is computed from, on rank r,
    each reading the result of a collective completing partial sums as c x a
    sequential value and making c' x the same value, c' not 1: the division that
    should cancel the factor the summed copies (local means) bring along, by the
    wrong amount (XLA folds such divisions into the literals after the collective,
    a second division too). introduces_factor never names the collective itself:
    the factor is fixed after it, and these ops are where it is not. Returns
    each as a RescaledSum. The walk
    back from t follows values held scaled on rank r only (the factor travels there),
    so it stays in the scaled region, not the whole cone of each frontier op."""
    upstream = _scaled_upstream(dist_prod, by_dist, t, r)
    found = []
    for x in sorted(upstream):
        made = dist_prod.get(x)
        if made is None or made.kind not in ("all_reduce", "reduce_scatter") \
                or introduces_factor(by_dist, made, r):
            continue
        for u in consumers.get(x, []):
            others = [i for i in u.inputs if i != x]
            if u.output not in upstream or u.kind not in ("mul", "div") or len(others) != 1 \
                    or (u.kind == "div" and u.inputs[0] != x) \
                    or by_dist.get((others[0], r)):   # the other operand: a literal
                continue
            found += [RescaledSum(u, made, w, v) for w in by_dist.get((x, r), [])
                      for v in by_dist.get((u.output, r), [])
                      if w.partial is None and v.partial is None and v.seq == w.seq
                      and w.scale != UNIT_SCALE and v.scale not in (UNIT_SCALE, w.scale)]
    return found


@dataclass(frozen=True)
class ResummedWhole:
    """`collective` sums `whole`, a value every rank of its group holds complete, into
    `made`: the group size times it."""

    collective: Op
    whole: ViewFact
    made: ViewFact


def resummed_whole(dist_prod: dict[int, Op], by_dist: dict[tuple[int, int], list[ViewFact]],
                   order: dict[int, int], t: int, r: int) -> ResummedWhole | None:
    """The earliest summing collective that t (held scaled on rank r) is computed from
    whose operand is no partial sum on rank r: every rank holds the value whole, so the
    sum multiplies it by the group size (a value reduced twice: a psum after a psum, or
    a pmean of gradients JAX's replication checks already summed). The walk back
    follows values held scaled on rank r, as rescaled_sums' does."""
    upstream = _scaled_upstream(dist_prod, by_dist, t, r)
    found = []
    for x in upstream:
        coll = dist_prod.get(x)
        if coll is None or coll.kind != "all_reduce" or coll.params.get("reducer") != "sum":
            continue
        whole = [w for i in coll.inputs for w in by_dist.get((i, r), [])]
        made = [v for v in by_dist.get((x, r), []) if v.partial is None]
        if whole and made and all(w.partial is None for w in whole):
            found.append(ResummedWhole(coll, whole[0], made[0]))
    return min(found, key=lambda f: order[f.collective.id]) if found else None


def primitives(op_name: str) -> set[str]:
    """The primitives an XLA metadata op_name names ("jit(f)/transpose(jvp())/mul;
    jit(f)/broadcast_in_dim": mul and broadcast_in_dim)."""
    return {part.rsplit("/", 1)[-1].strip() for part in op_name.split(";") if part.strip()}


def own_loc(op: Op, consumers: dict[int, list[Op]], dist_prod: dict[int, Op]) -> SourceLoc:
    """Where the user wrote `op`. XLA gives an instruction it makes while assigning
    layouts (a reshape as a bitcast) the metadata of its operand's producer, and the
    physical transpose next to it the metadata of the user's reshape: a reshape or
    transpose whose metadata names another primitive takes the location of its one
    neighbour (a consumer, or operand 0's producer) whose metadata names this op's
    primitive."""
    if not op.loc.op_name and op.loc.frames:
        return _shared_caller(op, consumers, dist_prod)
    if op.kind not in ("reshape", "transpose") or not op.loc.frames \
            or op.kind in primitives(op.loc.op_name):
        return op.loc
    near = list(consumers.get(op.output, []))
    near += [dist_prod[t] for t in op.inputs[:1] if t in dist_prod]
    named = [n.loc for n in near if n.loc.frames and op.kind in primitives(n.loc.op_name)]
    mine, here = op.loc.frames, op.loc.frames[0].file
    # with the HLO frontend's instruction_frames, every op's frames start with its
    # instruction's own line in the module: keep this op's, take the other's user frames
    instruction = all(f.file != here for f in mine[1:]) and all(
        n.frames[0].file == here and all(f.file != here for f in n.frames[1:]) for n in named)
    user = {n.frames[1:] if instruction else n.frames for n in named}
    if len(user) != 1:   # none, or neighbours written at different places
        return op.loc
    if instruction:
        return SourceLoc(mine[:1] + named[0].frames[1:], op.loc.op_name, op.loc.primary)
    return named[0]


def _shared_caller(op: Op, consumers: dict[int, list[Op]], dist_prod: dict[int, Op]) -> SourceLoc:
    """An instruction XLA left without metadata (a dot inside its fusions) is located
    at the user frames every neighbour with user frames (its readers, its operands'
    producers) shares, outermost first: the call of the function that wrote them all
    (the attention of a `_attend(q, k, v)` call). Its own frames (the instruction's
    lines in the module) stay first; no neighbour with user frames, or none shared:
    its own location."""
    mine = op.loc.frames
    here = mine[0].file
    if any(f.file != here for f in mine):
        return op.loc
    near = list(consumers.get(op.output, []))
    near += [dist_prod[t] for t in op.inputs if t in dist_prod]
    # (the HLO frontend's instruction_frames: a neighbour's own line in the module,
    # then its user frames, all elsewhere)
    users = [n.loc.frames[1:] for n in near if len(n.loc.frames) > 1
             and n.loc.frames[0].file == here and all(f.file != here for f in n.loc.frames[1:])]
    if not users:
        return op.loc
    shared: list = []
    for frames in zip(*(u[::-1] for u in users)):    # from the outermost frame in
        if any(f != frames[0] for f in frames):
            break
        shared.append(frames[0])
    if not shared:
        return op.loc
    return SourceLoc(mine + tuple(shared[::-1]), op.loc.op_name, op.loc.primary)


__all__ = ["RescaledSum", "UnscaledSum", "earliest_origin", "introduces_factor", "origin", "own_loc", "primitives",
           "rescaled_sums", "scaled_operand", "unscaled_sum"]
