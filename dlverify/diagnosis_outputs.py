"""The failures at the outputs and at the sequential frontier (for dlverify/diagnosis.py:
Judge.judge lists the distributed frontier first, then the sequential frontier ops
whose operands are held as plain blocks, the outputs, and last the sequential
frontier ops that only consequences of a lost relation reach)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlverify.diagnosis_origin import earliest_origin, rescaled_sums, unscaled_sum
from dlverify.verdict import UNIT_SCALE, Failure, fmt_offsets, scale_value

if TYPE_CHECKING:
    from dlverify.diagnosis import Judge


def seq_frontier_failures(j: Judge, failing: list) -> tuple[list[Failure], list[Failure]]:
    """The sequential frontier ops on the way to a failing output: those whose
    operands the distributed program holds as plain blocks, and those with an
    operand it holds only as partial sums or scaled (listed after the output
    failures: the relation was lost where the partial or the factor was made,
    which the distributed failures name; the sequential op merely finds no
    complete value to match)."""
    seq_anc = j._ancestor_ops(j.p.seq, [f[2] for f in failing])
    plain = {v.seq for v in j.views if v.partial is None and v.scale == UNIT_SCALE}
    related = {v.seq for v in j.views}
    first: list[Failure] = []
    later: list[Failure] = []
    sorder = {op.id: i for i, op in enumerate(j.p.seq.ops)}
    frontier = sorted((o for o in j.seq_frontier if o in seq_anc), key=sorder.__getitem__)
    by_seq: dict[tuple[int, int], list] = {}
    wanted = {t for o in frontier for t in j.seq_ops[o].inputs}
    for v in j.views:
        if v.seq in wanted:
            by_seq.setdefault((v.seq, v.rank), []).append(v)
    for op_id in frontier:
        op = j.seq_ops[op_id]
        lost_before = any(t in related and t not in plain for t in op.inputs)
        (later if lost_before else first).append(Failure(
            op.kind, op.loc.file, op.loc.line,
            f"the sequential {op.kind} has operands related to the distributed program but "
            f"no distributed value equals (a block of) its output"
            + (" (an operand is held only as partial sums or scaled)" if lost_before else ""),
            "sequential", op.loc.frames, kind="sequential-frontier",
            operand_views=_held_operands(j, op, by_seq)))
    return first, later


def _held_operands(j: Judge, op, by_seq: dict[tuple[int, int], list]) -> dict[int, list[str]]:
    """For the first rank holding any operand of the sequential op: what distributed
    value holds each operand there, and how."""
    for r in range(j.p.mesh.size):
        held = [by_seq.get((t, r), [])[:2] for t in op.inputs]
        if any(held):
            return {r: ["; ".join(f"{_dist_desc(j, v.dist)} holds {j.view_text(v)}" for v in vs)
                        or "no view" for vs in held]}
    return {}


def _dist_desc(j: Judge, d: int) -> str:
    p = j.dist_prod.get(d)
    return j.op_desc(p) if p is not None else "a distributed input"


def output_failures(j: Judge, failing: list) -> list[Failure]:
    """A failure per failing output (its first failing rank): the pattern its views
    show (a partial sum never reduced, a scale, a wrong block), reported where the
    partial or the factor was made."""
    out = []
    live = j._live(failing)
    for idx, name, s, d, rel, bad in failing:
        prod = j.dist_prod.get(d)
        for r in bad[:1] if len(bad) > 1 else bad:
            vs = j.by_seq_dist.get((s, d, r), [])
            # a partial result of a collective whose operand lacks terms on every rank
            made = j._origin(d, r, vs) if vs and vs[0].partial is not None else None
            lost = (j._missing_terms(made, r, live)
                    if made is not None and made.kind in ("all_reduce", "reduce_scatter") else None)
            if lost is not None:
                out.append(lost)
                continue
            kind = "no-relation"
            if rel is None and (not vs or any(w.partial is None and w.scale == UNIT_SCALE
                                              for w in vs)):
                # whole blocks out of device order (outputs.py), or no views; with only
                # partial or scaled views, what is wrong with them is said below
                whole = {q: [w for w in j.by_seq_dist.get((s, d, q), [])
                             if w.partial is None and w.scale == UNIT_SCALE] for q in bad}
                msg = f"{name}: no expected relation given"
                if all(whole.values()):
                    kind, shape = "wrong-block", j.p.dist.tensors[d].shape
                    held = ", ".join(f"rank {q} {fmt_offsets(whole[q][0].offsets, shape)}"
                                     for q in bad[:4])
                    msg += (f", and the ranks hold whole blocks of it out of device order "
                            f"({held}{', ...' if len(whole) > 4 else ''}): a shift or swap "
                            f"in the wrong direction?")
            elif not vs:
                msg = (f"{name} on rank {r}: no relation to the sequential output derived")
            else:
                v = vs[0]
                shape = j.p.dist.tensors[d].shape
                if v.partial is not None:
                    kind = "unreduced-partial"
                    msg = (f"{name} on rank {r} is a partial sum that is never reduced "
                           f"({j.view_text(v)})")
                elif v.scale != UNIT_SCALE:
                    kind = "scale-mismatch"
                    whole = [w for w in vs if w.partial is None]
                    found = earliest_origin(j.dist_prod, j.by_dist, j.seq_prod,
                                            j._order, d, r, whole)
                    entry = found[0] if found else None
                    msg = (f"{name} on rank {r} is {scale_value(v.scale)} times the sequential "
                           f"value: scale differs by {scale_value(v.scale)}"
                           + (f" (the factor enters at {j.op_desc(entry)})" if entry else ""))
                    summed = None if entry or rescaled_sums(j.dist_prod, j._consumers, j.by_dist,
                                                            d, r) \
                        else unscaled_sum(j.dist_prod, j.by_dist, j.seq_prod, d, r, whole)
                    if summed is not None:   # no op makes the factor: a sum never divided
                        entry, terms = summed.collective, summed.terms
                        msg += (f" ({j.op_desc(entry)} sums partial terms each "
                                f"{scale_value(terms.scale)} times the sequential ones, and "
                                f"nothing after it divides the sum: local means summed over "
                                f"the ranks, a division missing?)")
                else:
                    kind = "wrong-block"
                    msg = (f"{name} on rank {r} holds {fmt_offsets(v.offsets, shape)} of the "
                           f"sequential output but the output relation requires "
                           f"{fmt_offsets(rel.offsets[r], shape)}")
            if len(bad) > 1:
                msg += f" (ranks {bad} fail)"
            loc_op = prod
            if vs and vs[0].partial is not None:
                loc_op = j._origin(d, r, vs) or prod
            elif kind == "scale-mismatch" and entry is not None:
                loc_op = entry
            frames = loc_op.loc.frames if loc_op else ()
            out.append(Failure(loc_op.kind if loc_op else "output",
                               loc_op.loc.file if loc_op else "", loc_op.loc.line if loc_op else 0,
                               msg, "distributed", frames, tuple(bad), kind=kind,
                               operand_views={q: [j.view_text(w) for w in
                                                  j.by_seq_dist.get((s, d, q), [])[:3]]
                                              or ["no view"] for q in bad}))
    return out


__all__ = ["output_failures", "seq_frontier_failures"]
