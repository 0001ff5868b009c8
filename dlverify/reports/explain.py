"""`--explain`: why a distributed tensor equals (a block of) a sequential one.

The engines return the derived views, not which rule produced each. This module
rebuilds a derivation from them: for a view it finds a rule family whose
premises (views of the ops' operands) are all among the derived views, and
recurses to the input relations. Every step shown is an instance of a rule of
datalog/*.dl whose conclusion and premises were all derived.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from dlverify import ir
from dlverify import schema as S
from dlverify.ir import CHAIN_DEPTH, CHAIN_REDUCTIONS, Graph, Op
from dlverify.verdict import UNIT_SCALE, Result, ViewFact, fmt_offsets, scale_value, short_path

@dataclass
class Step:
    view: ViewFact
    rule: str               # the rule family, with its file
    where: str              # the ops involved, with source lines
    premises: list["Step"] = field(default_factory=list)


def _family(kind: str) -> str:
    """The rule family that derives views of a `kind` op's output, with its rule file:
    the assembler families are declared in schema.RULE_FAMILIES."""
    if kind in ir.COLLECTIVES:
        return f"{kind} (collectives.dl)"
    file = S.rule_file_of(kind)
    if file is not None:
        return f"{kind} ({file})"
    if kind == "concatenate":  # chained block by block, not through the assembler
        return f"{kind} (layout.dl)"
    if kind in ir.LAYOUT:
        return f"{kind} (data movement rules)"
    return f"elementwise {kind} (elementwise.dl)"


def _loc(op: Op) -> str:
    return f"{op.kind} at {short_path(op.loc.file)}:{op.loc.line}" if op.loc.frames else op.kind


class Explainer:
    def __init__(self, result: Result) -> None:
        if result.problem is None:
            raise ValueError("the result carries no problem to explain")
        self.p = result.problem
        self.views = set(result.views)
        self.by_pair: dict[tuple[int, int, int], list[ViewFact]] = defaultdict(list)
        self.by_dist: dict[tuple[int, int], list[ViewFact]] = defaultdict(list)
        for v in result.views:
            self.by_pair[(v.seq, v.dist, v.rank)].append(v)
            self.by_dist[(v.dist, v.rank)].append(v)
        self.sprod = self.p.seq.producer()
        self.dprod = self.p.dist.producer()
        self.inputs = {(s, d) for s, d in zip(self.p.seq.inputs, self.p.dist.inputs)}

    def _pair_views(self, s: int, d: int, r: int) -> list[ViewFact]:
        return self.by_pair.get((s, d, r), [])

    def step(self, v: ViewFact, depth: int, seen: set[ViewFact]) -> Step:
        if (v.seq, v.dist) in self.inputs:
            return Step(v, "input relation (in_specs / spec)", "program input")
        if depth <= 0 or v in seen:
            return Step(v, "...", "(already shown or depth limit)")
        seen = seen | {v}
        dop, sop = self.dprod.get(v.dist), self.sprod.get(v.seq)
        # 1. the same op on both sides, operands related position by position
        if dop is not None and sop is not None and dop.kind == sop.kind and \
                len(dop.inputs) == len(sop.inputs) and dop.kind not in ir.COLLECTIVES:
            prem = []
            for si, di in zip(sop.inputs, dop.inputs):
                cands = self._pair_views(si, di, v.rank)
                if cands:
                    prem.append(cands[0])
            if prem:
                return Step(v, _family(dop.kind), f"{_loc(dop)} ~ {_loc(sop)}",
                            [self.step(p, depth - 1, seen) for p in prem])
        # 2. the distributed side moves data within views of the same s
        if dop is not None:
            ranks = [v.rank]
            if dop.kind in ir.COLLECTIVES:
                ranks = sorted({r for grp in dop.params.get("groups", []) if v.rank in grp for r in grp}
                               | {src for src, dst in dop.params.get("pairs", []) if dst == v.rank})
            prem = [c for t in dop.inputs for r in ranks for c in self._pair_views(v.seq, t, r)[:1]]
            if prem:
                return Step(v, _family(dop.kind) + (" on the distributed side" if dop.kind not in ir.COLLECTIVES else ""),
                            _loc(dop), [self.step(p, depth - 1, seen) for p in prem])
        # 3. the sequential side moves data (or scales) within views of the same d
        if sop is not None:
            prem = [c for t in sop.inputs for c in self._pair_views(t, v.dist, v.rank)[:1]]
            if prem:
                return Step(v, _family(sop.kind) + " on the sequential side", _loc(sop),
                            [self.step(p, depth - 1, seen) for p in prem])
        # 4. a result of a scan concluded by induction over its body (dlverify/induction.py)
        for sc in self.p.scans:
            if v.seq in sc.seq.final + sc.seq.ys and v.dist in sc.dist.final + sc.dist.ys:
                prem = [c for s in sc.seq.operands() for d in sc.dist.operands()
                        for c in self._pair_views(s, d, v.rank)[:1]]
                file, _, line = sc.where.rpartition(":")
                return Step(v, f"induction over one body for {sc.seq.length} iterations "
                               "(induction.py)", f"scan at {short_path(file)}:{line}",
                            [self.step(p, depth - 1, seen) for p in prem])
        # 5. chains of ops that move no element, paired by the reshape groups, from
        # starts related by a view, or by reductions whose axes differ by size-1 dims
        if dop is not None and sop is not None:
            step = self._chain_step(v, dop, sop, depth, seen)
            if step is not None:
                return step
        # 6. a sum whose terms the programs add in another order (sum_trees.dl)
        if dop is not None and dop.kind == "add" and sop is not None and sop.kind == "add":
            prem = self._tree_terms(dop, self._sum_nodes(v.seq), v.rank)
            if prem:
                return Step(v, "sum re-associated (sum_trees.dl)", _loc(dop),
                            [self.step(p, depth - 1, seen) for p in prem])
        return Step(v, "constant or iota", _loc(dop) if dop else "")

    def _sum_nodes(self, s: int) -> set[int]:
        """s and the sequential values its adds add up (the nodes of its sum tree, and
        of the adds under it)."""
        nodes, todo = {s}, [s]
        while todo:
            p = self.sprod.get(todo.pop())
            for i in p.inputs if p is not None and p.kind == "add" else ():
                if i not in nodes:
                    nodes.add(i)
                    todo.append(i)
        return nodes

    def _tree_terms(self, add: Op, nodes: set[int], r: int) -> list[ViewFact] | None:
        """The views of the terms a distributed tree of adds sums, each a sequential value
        in `nodes` (the adds between them have no view of their own)."""
        out: list[ViewFact] = []
        for t in add.inputs:
            ws = [w for w in self.by_dist.get((t, r), []) if w.partial is None and w.seq in nodes]
            inner = self.dprod.get(t)
            if ws:
                out.append(ws[0])
            elif inner is not None and inner.kind == "add":
                sub = self._tree_terms(inner, nodes, r)
                if sub is None:
                    return None
                out += sub
            else:
                return None
        return out

    def _chain(self, g: Graph, prod: dict[int, Op], t: int) -> list[int]:
        """t and the tensors up the chain of ops that move no element ending at t (a
        broadcast_in_dim that expands may end it), as dlverify/layout_algebra.py follows it."""
        out, op = [t], prod.get(t)
        for i in range(CHAIN_DEPTH):
            if op is None or not (g.moves_no_element(op) or (i == 0 and op.kind == "broadcast_in_dim")):
                break
            out.append(op.inputs[0])
            op = prod.get(op.inputs[0])
        return out

    def _chain_step(self, v: ViewFact, dop: Op, sop: Op, depth: int, seen: set[ViewFact]) -> Step | None:
        dch, sch = self._chain(self.p.dist, self.dprod, v.dist), self._chain(self.p.seq, self.sprod, v.seq)
        where = f"{_loc(dop)} ~ {_loc(sop)}"
        for ds in dch[1:]:
            for ss in sch[1:]:
                for c in self._pair_views(ss, ds, v.rank)[:1]:
                    return Step(v, "reshape chain (layout_algebra.dl)", where, [self.step(c, depth - 1, seen)])
        for ds in dch[1:]:
            for ss in sch:
                dr, sr = self.dprod.get(ds), self.sprod.get(ss)
                if dr is None or sr is None or dr.kind not in CHAIN_REDUCTIONS or sr.kind != dr.kind:
                    continue
                for c in self._pair_views(sr.inputs[0], dr.inputs[0], v.rank)[:1]:
                    return Step(v, "reductions whose axes differ by size-1 dims (reduce_squeeze.dl), "
                                   "then reshapes (layout_algebra.dl)", f"{_loc(dr)} ~ {_loc(sr)}; {where}",
                                [self.step(c, depth - 1, seen)])
        return None

    def render(self, v: ViewFact, depth: int = 12) -> list[str]:
        lines: list[str] = []
        shown: set[ViewFact] = set()

        def show(st: Step, indent: int) -> None:
            pad = "  " * indent
            if st.view in shown and st.premises:
                lines.append(pad + f"{self.describe(st.view)}  (derived above)")
                return
            shown.add(st.view)
            lines.append(pad + f"{self.describe(st.view)}")
            lines.append(pad + f"  by {st.rule}: {st.where}")
            for p in st.premises:
                show(p, indent + 1)

        show(self.step(v, depth, set()), 0)
        return lines

    def describe(self, v: ViewFact) -> str:
        g: Graph = self.p.dist
        shape = g.tensors[v.dist].shape
        dname = self._name(self.p.dist, v.dist, self.dprod)
        sname = self._name(self.p.seq, v.seq, self.sprod)
        text = f"rank {v.rank}: {dname} = "
        if v.scale != UNIT_SCALE:
            text += f"{scale_value(v.scale)} x "
        if v.partial is not None:
            text += f"partial {v.partial.reducer_name} [{v.partial.lo}:{v.partial.hi}) of "
        return text + f"{sname}{fmt_offsets(v.offsets, shape)}"

    def _name(self, g: Graph, t: int, prod: dict[int, Op]) -> str:
        if t in g.inputs:
            i = g.inputs.index(t)
            return g.input_names[i] if i < len(g.input_names) else f"in{i}"
        if t in g.outputs:
            i = g.outputs.index(t)
            return g.output_names[i] if i < len(g.output_names) else f"out{i}"
        op = prod.get(t)
        return f"%{t}({_loc(op)})" if op else f"%{t}"


def explain(result: Result, target: str, rank: int = 0) -> list[str]:
    """The derivation of output `target` ("out0", or an output index) on `rank`."""
    ex = Explainer(result)
    p = ex.p
    names = p.seq.output_names or [f"out{i}" for i in range(len(p.seq.outputs))]
    if target.isdigit():
        idx = int(target)
    elif target in names:
        idx = names.index(target)
    else:
        raise ValueError(f"no output named {target!r}; outputs are {names}")
    if not 0 <= idx < len(p.seq.outputs):
        raise ValueError(f"output index {idx} out of range (0..{len(p.seq.outputs) - 1})")
    s, d = p.seq.outputs[idx], p.dist.outputs[idx]
    cands = [v for v in ex._pair_views(s, d, rank)]
    if not cands:
        return [f"{names[idx]} on rank {rank}: no view derived, nothing to explain"]
    cands.sort(key=lambda v: (v.partial is not None, v.scale != UNIT_SCALE))
    return ex.render(cands[0])
