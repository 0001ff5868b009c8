"""Exporters of the control-flow primitives: `scan` (and `fori_loop` with static
bounds, which JAX lowers to it), `while` with a trip count known at trace time,
and `cond` (`lax.cond`, `lax.switch`).

Loops are unrolled into the IR: iteration i of a scan applies the body to the
carry and to slice i of every scanned operand, and its per-iteration outputs
are stacked again. Deep unrolled stacks are cheap to verify because the
iterations are identical blocks (dlverify/structure.py cuts the programs there
and dlverify/memo.py runs the engine once per distinct block).

A while loop is unrolled only when its condition can be evaluated before run
time on every iteration (a counter started at a constant): the condition is
evaluated by the shared evaluator (dlverify/ops) on the known values of the
carry, then its ops are dropped again. A condition that depends on data or on
the rank is an UnknownOpError at the loop's line.

`cond` with an index known before run time is its chosen branch; otherwise
every branch is computed and `select_n` picks the result, an identity as long
as the branches are pure, which is why a branch holding a collective (whose
participation would depend on the index) is refused.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dlverify.errors import UnknownOpError
from dlverify.frontends.jaxpr.known import KnownValues
from dlverify.frontends.jaxpr.walk import Ctx, _elementwise, _loc, _out, _where, exporter, walk
from dlverify.ir import Graph, GraphBuilder, Op, SourceLoc
from dlverify.ops.export import reshape_groups

MAX_UNROLLED_EQNS = 400_000  # iterations x body equations: beyond this the IR would not fit


def _check_size(eqn: Any, iterations: int, body: Any) -> None:
    inner = body.jaxpr if hasattr(body, "jaxpr") else body
    if iterations * max(1, len(inner.eqns)) > MAX_UNROLLED_EQNS:
        raise UnknownOpError(f"{eqn.primitive.name} of {iterations} iterations over a body of "
                             f"{len(inner.eqns)} equations is too large to unroll "
                             f"(limit {MAX_UNROLLED_EQNS} equations)", *_where(eqn))


def _slice_row(ctx: Ctx, stacked: int, i: int, loc: SourceLoc) -> int:
    """Row i of a stacked operand (dim 0 removed). A stack built by an earlier
    scan of this walk is not sliced: row i is the tensor iteration i produced."""
    rows = ctx.stacks.get(stacked)
    if rows is not None:
        return rows[i]
    t = ctx.b.graph.tensors[stacked]
    source = _split_source(ctx, stacked)
    if source is not None:
        # row i of x.reshape(n, m, ...) is rows [i m, (i + 1) m) of x (a batch split
        # into micro-batches): slice x itself, so the row meets the sequential rows
        x = ctx.b.graph.tensors[source]
        m = x.shape[0] // t.shape[0]
        cut = ctx.b.op("slice", [source], (m,) + x.shape[1:], x.dtype,
                       {"start_indices": (i * m,) + (0,) * (x.rank - 1),
                        "limit_indices": ((i + 1) * m,) + x.shape[1:], "strides": None}, loc, "scan")
        if (m,) + x.shape[1:] == t.shape[1:]:
            return cut
        return ctx.b.op("reshape", [cut], t.shape[1:], t.dtype, {}, loc, "scan")
    starts = (i,) + (0,) * (t.rank - 1)
    limits = (i + 1,) + t.shape[1:]
    row = ctx.b.op("slice", [stacked], (1,) + t.shape[1:], t.dtype,
                   {"start_indices": starts, "limit_indices": limits, "strides": None}, loc, "scan")
    return ctx.b.op("reshape", [row], t.shape[1:], t.dtype, {}, loc, "scan")


def _split_source(ctx: Ctx, stacked: int) -> int | None:
    """x when `stacked` is a reshape of x that splits x's dim 0 into (n, m, ...) as
    its leading dims (dim 0 of the stack being the outer factor), else None."""
    ctx.known.index(ctx.b.graph.ops)
    op = ctx.known.producer.get(stacked)
    if op is None or op.kind != "reshape":
        return None
    src, dst = ctx.b.graph.tensors[op.inputs[0]].shape, ctx.b.graph.tensors[stacked].shape
    groups = reshape_groups(src, dst)
    if not groups or groups[0][0] != [0] or len(groups[0][1]) < 2 or groups[0][1][0] != 0:
        return None
    return op.inputs[0]


def _stack(ctx: Ctx, rows: list[int], shape: tuple[int, ...], dtype: str, loc: SourceLoc) -> int:
    """Rows (in index order) stacked along a new dim 0."""
    if not rows:
        return ctx.b.constant(np.zeros(shape, dtype=np.dtype(dtype)), shape, dtype, loc, "scan")
    parts = [ctx.b.op("reshape", [r], (1,) + shape[1:], dtype, {}, loc, "scan") for r in rows]
    out = parts[0] if len(parts) == 1 else ctx.b.op(
        "concatenate", parts, shape, dtype, {"dimension": 0}, loc, "scan")
    ctx.stacks[out] = list(rows)
    return out


MAX_COUNTER_CHECKS = 100_000  # iterations whose w[i] index is evaluated (one scalar expression each)
MAX_CONST_CONE = 256  # ops of a const computed from constants alone copied into a summarised body


def _constant_cone(graph: Graph, producer: dict[int, Op], t: int) -> list[Op] | None:
    """The ops computing `t` from constants alone (no input, no placeholder), in
    program order; None when `t` depends on anything else or the cone is large."""
    ops: dict[int, Op] = {}
    stack = [t]
    while stack:
        x = stack.pop()
        op = producer.get(x)
        if op is None:
            return None
        if op.id in ops:
            continue
        ops[op.id] = op
        if len(ops) > MAX_CONST_CONE:
            return None
        stack.extend(op.inputs)
    position = {op.id: i for i, op in enumerate(graph.ops)}
    return sorted(ops.values(), key=lambda op: position[op.id])


def _summarise(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int] | None:
    """The scan exported once for induction (dlverify/induction.py): the body as a
    graph of its own over placeholders, the results as placeholders of this
    graph, and a ScanSide recorded in ctx.scans. None when the body cannot be
    exported on its own (it needs values known before run time): unroll it."""
    from dlverify.induction import ScanSide

    p = eqn.params
    length, n_consts, n_carry = int(p["length"]), int(p["num_consts"]), int(p["num_carry"])
    consts, init, xs = ins[:n_consts], ins[n_consts:n_consts + n_carry], ins[n_consts + n_carry:]
    outer = ctx.b.graph
    body_graph = Graph(f"{outer.name} scan body")
    bb = GraphBuilder(body_graph, ctx.b.ids)
    producer = outer.producer()
    copied: dict[int, int] = {}
    seeded: list[int] = []
    body_consts: list[int] = []
    body_in: list[int] = []
    for t in consts:
        cone = _constant_cone(outer, producer, t)
        if cone is None:  # a placeholder, seeded from the outer views
            ph = bb.tensor(outer.tensors[t].shape, outer.tensors[t].dtype, "scan const")
            seeded.append(t)
            body_consts.append(ph)
            body_in.append(ph)
            continue
        for op in cone:  # computed in the body itself (a mask, a rotary table)
            if op.output not in copied:
                ot = outer.tensors[op.output]
                copied[op.output] = bb.op(op.kind, [copied[i] for i in op.inputs], ot.shape,
                                          ot.dtype, dict(op.params), op.loc, op.name)
        body_in.append(copied[t])
    carry = [bb.tensor(outer.tensors[t].shape, outer.tensors[t].dtype, "scan carry") for t in init]
    rows = [bb.tensor(outer.tensors[t].shape[1:], outer.tensors[t].dtype, "scan row") for t in xs]
    body_ctx = Ctx(bb, ctx.mesh, ctx.in_shard_map, ctx.fallback)  # nested scans: unrolled
    try:
        outs = walk(body_ctx, p["jaxpr"], body_in + carry + rows)
    except UnknownOpError:
        return None
    body_graph.outputs = list(outs)
    loc = _loc(eqn)
    if not p["reverse"]:
        for w, row in _counter_rows(ctx, body_graph, length, init, carry, dict(zip(body_consts, seeded)),
                                    outs[:n_carry], loc):
            xs, rows = list(xs) + [w], rows + [row]
    final = [ctx.b.tensor(*_out(eqn, k), "scan carry") for k in range(n_carry)]
    ys = [ctx.b.tensor(*_out(eqn, k), "scan ys") for k in range(n_carry, len(eqn.outvars))]
    ctx.scans.append(ScanSide(f"{loc.file}:{loc.line}", length, bool(p["reverse"]), seeded,
                              body_consts, list(init), carry, list(xs), rows, final, ys,
                              body_graph))
    return final + ys


def _counters(ctx: Ctx, body: Graph, init: list[int], carry: list[int],
              carry_out: list[int]) -> dict[int, int]:
    """Carry placeholders that count iterations (`fori_loop`'s index): a known
    integer initial value, plus 1 per iteration -> their initial values."""
    producer = body.producer()
    out: dict[int, int] = {}
    for t0, c_in, c_out in zip(init, carry, carry_out):
        op = producer.get(c_out)
        if op is None or op.kind != "add" or len(op.inputs) != 2 or c_in not in op.inputs:
            continue
        step = KnownValues().value(body, op.inputs[1] if op.inputs[0] == c_in else op.inputs[0])
        start = ctx.known.value(ctx.b.graph, t0)
        if step is None or start is None or np.asarray(step).size != 1 \
                or not np.issubdtype(np.asarray(start).dtype, np.integer):
            continue
        if int(np.asarray(step).reshape(())) == 1:
            out[c_in] = int(np.asarray(start).reshape(()))
    return out


def _counter_rows(ctx: Ctx, body: Graph, length: int, init: list[int], carry: list[int],
                  const_of: dict[int, int], carry_out: list[int],
                  loc: SourceLoc) -> list[tuple[int, int]]:
    """`w[i]` in a (forward) loop whose counter i runs a, a+1, ..., a+L-1 reads row t
    of w[a:a+L] at iteration t: each such dynamic_slice of a seeded const w becomes
    a reshape of a row placeholder, and w[a:a+L] a scanned operand (so the
    induction sees rows, not an index unknown in the body). The index is
    evaluated by the shared evaluator for every iteration. Returns the new
    (scanned operand, row placeholder) pairs."""
    counters = _counters(ctx, body, init, carry, carry_out)
    if not counters or length > MAX_COUNTER_CHECKS:
        return []
    out = []
    for op in body.ops:
        w = const_of.get(op.inputs[0]) if op.kind == "dynamic_slice" and op.inputs else None
        if w is None:
            continue
        wt = ctx.b.graph.tensors[w]
        sizes = tuple(op.params["slice_sizes"])
        if wt.rank == 0 or sizes != (1,) + wt.shape[1:] or len(op.inputs) != wt.rank + 1:
            continue
        if any(_value(body, {}, t) != 0 for t in op.inputs[2:]):
            continue
        starts = [_value(body, {c: v + it for c, v in counters.items()}, op.inputs[1])
                  for it in range(length)]
        if starts[0] is None or starts != list(range(starts[0], starts[0] + length)) \
                or starts[0] < 0 or starts[0] + length > wt.shape[0]:
            continue
        a = starts[0]
        stacked = w if (a, length) == (0, wt.shape[0]) else ctx.b.op(
            "slice", [w], (length,) + wt.shape[1:], wt.dtype,
            {"start_indices": (a,) + (0,) * (wt.rank - 1),
             "limit_indices": (a + length,) + wt.shape[1:], "strides": None}, loc, "scan")
        row = GraphBuilder(body, ctx.b.ids).tensor(wt.shape[1:], wt.dtype, "scan row")
        op.kind, op.inputs, op.params = "reshape", [row], {}  # the row, as the slice's shape
        out.append((stacked, row))
    return out


def _value(body: Graph, given: dict[int, int], t: int) -> int | None:
    """Scalar t of `body` evaluated from constants and the `given` counters."""
    known = KnownValues()
    for c, v in given.items():
        known.values[c] = np.asarray(v, dtype=np.dtype(body.tensors[c].dtype))
    v = known.value(body, t)
    return None if v is None or np.asarray(v).size != 1 else int(np.asarray(v).reshape(()))


@exporter("scan")
def _scan(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    p = eqn.params
    length, n_consts, n_carry = int(p["length"]), int(p["num_consts"]), int(p["num_carry"])
    body = p["jaxpr"]
    if ctx.scans is not None and length > 0:
        summary = _summarise(ctx, eqn, ins)
        if summary is not None:
            return summary
    _check_size(eqn, length, body)
    loc = _loc(eqn)
    consts, carry, xs = ins[:n_consts], list(ins[n_consts:n_consts + n_carry]), ins[n_consts + n_carry:]
    n_ys = len(eqn.outvars) - n_carry
    ys_rows: list[list[int]] = [[0] * length for _ in range(n_ys)]
    order = range(length - 1, -1, -1) if p["reverse"] else range(length)
    # Every row is cut before the first iteration, so the iterations' ops are
    # identical up to ids (one memo entry serves them all, dlverify/memo.py).
    rows = {i: [_slice_row(ctx, x, i, loc) for x in xs] for i in order}
    for i in order:
        outs = walk(ctx, body, consts + carry + rows[i])
        carry = outs[:n_carry]
        for k, y in enumerate(outs[n_carry:]):
            ys_rows[k][i] = y
    ys = []
    for k in range(n_ys):
        shape, dtype = _out(eqn, n_carry + k)
        ys.append(_stack(ctx, ys_rows[k], shape, dtype, loc))
    return carry + ys


@exporter("while")
def _while(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    p = eqn.params
    n_cond, n_body = int(p["cond_nconsts"]), int(p["body_nconsts"])
    cond_consts, body_consts = ins[:n_cond], ins[n_cond:n_cond + n_body]
    carry = list(ins[n_cond + n_body:])
    body = p["body_jaxpr"]
    inner = body.jaxpr if hasattr(body, "jaxpr") else body
    limit = MAX_UNROLLED_EQNS // max(1, len(inner.eqns))
    for iteration in range(limit + 1):
        graph = ctx.b.graph
        first_op, tensors_before = len(graph.ops), set(graph.tensors)
        (pred,) = walk(ctx, p["cond_jaxpr"], cond_consts + carry)
        value = ctx.known.value(ctx.b.graph, pred)
        # the condition's ops computed a value known now; they are not part of the program
        del graph.ops[first_op:]
        ctx.known.dropped_from(first_op)
        for t in set(graph.tensors) - tensors_before:
            del graph.tensors[t]
        if value is None:
            raise UnknownOpError("while loop whose condition is not known before run time (it "
                                 "depends on data or on the rank): only loops with a static trip "
                                 "count are supported", *_where(eqn))
        if not bool(np.asarray(value).reshape(())):
            return carry
        if iteration == limit:
            break
        carry = walk(ctx, body, body_consts + carry)
    raise UnknownOpError(f"while loop of more than {limit} iterations is too large to unroll",
                         *_where(eqn))


_COLLECTIVES = {"psum", "psum_invariant", "pmax", "pmin", "all_gather", "reduce_scatter",
                "all_to_all", "ppermute"}


def _has_collective(jaxpr: Any) -> bool:
    """Whether `jaxpr` or a jaxpr nested in its equations' params holds a collective."""
    inner = jaxpr.jaxpr if hasattr(jaxpr, "jaxpr") else jaxpr
    for e in inner.eqns:
        if e.primitive.name in _COLLECTIVES:
            return True
        for param in e.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if (hasattr(sub, "eqns") or hasattr(sub, "jaxpr")) and _has_collective(sub):
                    return True
    return False


_SELECT = _elementwise("select_n")


@exporter("cond")
def _cond(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    branches = eqn.params["branches"]
    index, operands = ins[0], ins[1:]
    value = ctx.known.value(ctx.b.graph, index)
    if value is not None:  # lax.switch clamps its index in the jaxpr, lax.cond gives 0 or 1
        chosen = int(np.clip(np.asarray(value).reshape(()), 0, len(branches) - 1))
        return walk(ctx, branches[chosen], operands)
    if any(_has_collective(b) for b in branches):
        raise UnknownOpError("cond whose branches hold collectives and whose predicate is not "
                             "known before run time is not supported", *_where(eqn))
    results = [walk(ctx, b, operands) for b in branches]
    outs = []
    for k in range(len(eqn.outvars)):
        # select_n(index, case0, case1, ...) picks case `index`, elementwise
        pick = _Pick(eqn, k)
        outs.append(_SELECT(ctx, pick, [index] + [r[k] for r in results])[0])
    return outs


class _Pick:
    """The view of a cond equation that the select_n exporter reads: output k."""

    def __init__(self, eqn: Any, k: int) -> None:
        self.outvars = [eqn.outvars[k]]
        self.primitive = eqn.primitive
        self.source_info = eqn.source_info
        self.params: dict[str, Any] = {}
