"""The smallest failing subgraph: the ops that connect related values to each
failure, in both programs, as networkx graphs, DOT text and (with Graphviz) SVG."""
from __future__ import annotations

import shutil
import subprocess
from collections import deque
from pathlib import Path

import networkx as nx

from dlverify.ir import Graph
from dlverify.verdict import Result, short_path

MAX_OPS = 40


def _cone(g: Graph, targets: list[int], related: set[int], max_ops: int) -> nx.DiGraph:
    """Ops from the nearest related tensors (or program inputs) up to the target ops,
    breadth first backwards, at most `max_ops` of them."""
    prod = g.producer()
    ops = {op.id: op for op in g.ops}
    keep: list[int] = []
    queue = deque(t for t in targets if t in ops)
    seen = set(queue)
    while queue and len(keep) < max_ops:
        op = ops[queue.popleft()]
        keep.append(op.id)
        for t in op.inputs:
            src = prod.get(t)
            if src is None or src.id in seen or (t in related and src.id not in targets):
                continue
            seen.add(src.id)
            queue.append(src.id)
    out = nx.DiGraph()
    kept = set(keep)
    for oid in keep:
        op = ops[oid]
        where = f"{short_path(op.loc.file)}:{op.loc.line}" if op.loc.frames else ""
        out.add_node(f"op{oid}", label=f"{op.kind}\\n{where}", failing=oid in targets, kind="op")
        for t in op.inputs:
            src = prod.get(t)
            if src is not None and src.id in kept:
                out.add_edge(f"op{src.id}", f"op{oid}")
            else:
                ten = g.tensors[t]
                tag = "related" if t in related else "unrelated"
                name = ten.name or f"%{t}"
                out.add_node(f"t{t}", label=f"{name}\\n{list(ten.shape)}\\n{tag}", kind="value",
                             related=t in related)
                out.add_edge(f"t{t}", f"op{oid}")
    return out


def failing_subgraphs(result: Result, max_ops: int = MAX_OPS) -> dict[str, nx.DiGraph]:
    """{"distributed": ..., "sequential": ...} around the result's failures."""
    p = result.problem
    if p is None:
        raise ValueError("the result carries no problem")
    related_d = {v.dist for v in result.views}
    related_s = {v.seq for v in result.views}
    dprod, sprod = p.dist.producer(), p.seq.producer()
    d_ops = {op.id for op in p.dist.ops}
    targets_d, targets_s = [], []
    for f in result.failures:
        for op in (p.seq.ops if f.program == "sequential" else p.dist.ops):
            if op.kind == f.op and op.loc.line == f.line and op.loc.file == f.file:
                (targets_s if f.program == "sequential" else targets_d).append(op.id)
    if not targets_d:  # fall back on the producers of the failing outputs
        targets_d = [dprod[t].id for t in p.dist.outputs if t in dprod and dprod[t].id in d_ops]
    if not targets_s:
        targets_s = [sprod[t].id for t in p.seq.outputs if t in sprod]
    return {"distributed": _cone(p.dist, targets_d, related_d, max_ops),
            "sequential": _cone(p.seq, targets_s, related_s, max_ops)}


def to_dot(graphs: dict[str, nx.DiGraph], title: str = "") -> str:
    lines = ["digraph failing {", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    if title:
        lines.append(f'  label="{title}"; labelloc=t;')
    for i, (name, g) in enumerate(graphs.items()):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f'    label="{name} program";')
        for n, data in g.nodes(data=True):
            if data.get("kind") == "op":
                style = ('style=filled, fillcolor="#f4a6a6", color=red' if data.get("failing")
                         else "shape=box")
                lines.append(f'    "{name}_{n}" [label="{data["label"]}", shape=box, {style}];')
            else:
                color = "#b7e1b0" if data.get("related") else "#dddddd"
                lines.append(f'    "{name}_{n}" [label="{data["label"]}", shape=ellipse, '
                             f'style=filled, fillcolor="{color}"];')
        for a, b in g.edges():
            lines.append(f'    "{name}_{a}" -> "{name}_{b}";')
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_graph(result: Result, path: Path) -> str:
    """Write the failing subgraph to `path` (.dot, or .svg/.png through Graphviz's `dot`).
    Returns a note on what was written."""
    dot = to_dot(failing_subgraphs(result), result.name)
    suffix = path.suffix.lower()
    if suffix in (".svg", ".png", ".pdf"):
        exe = shutil.which("dot")
        if exe is None:
            alt = path.with_suffix(".dot")
            alt.write_text(dot)
            return f"Graphviz `dot` is not installed: wrote {alt} instead of {path}"
        subprocess.run([exe, f"-T{suffix[1:]}", "-o", str(path)], input=dot.encode(), check=True)
        return f"wrote {path}"
    path.write_text(dot)
    return f"wrote {path}"
