"""Exporters of sort (several operands: argsort sorts values with an iota) and
top_k: one IR op per result, each reading every operand, with the result's
number in `output` (the IR's ops have one output each)."""
from __future__ import annotations

from typing import Any

from dlverify.frontends.jaxpr.walk import Ctx, _loc, _out, exporter


@exporter("sort")
def _sort(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    params = {"dimension": int(eqn.params["dimension"]), "num_keys": int(eqn.params["num_keys"])}
    outs = []
    for i in range(len(eqn.outvars)):
        shape, dtype = _out(eqn, i)
        outs.append(ctx.b.op("sort", list(ins), shape, dtype, {**params, "output": i}, _loc(eqn), "sort"))
    return outs


@exporter("top_k")
def _top_k(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    params = {"axis": int(eqn.params.get("axis", len(eqn.invars[0].aval.shape) - 1)),
              "k": int(eqn.params["k"])}
    outs = []
    for i in range(2):
        shape, dtype = _out(eqn, i)
        outs.append(ctx.b.op("top_k", ins[:1], shape, dtype, {**params, "output": i}, _loc(eqn), "top_k"))
    return outs
