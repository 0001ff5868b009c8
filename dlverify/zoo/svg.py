"""The failing subgraph (dlverify/reports/graph.py's networkx graphs) drawn as
inline SVG without Graphviz: nodes in layers by their longest distance from a
source (networkx's topological generations), one column of boxes per layer
position, the two programs side by side. Failing ops are red, values related
to the sequential program green, unrelated values grey."""
from __future__ import annotations

import hashlib
from html import escape

import networkx as nx

NODE_W, NODE_H = 150, 46
GAP_X, GAP_Y = 24, 34
PAD = 16
TITLE_H = 22
MAX_LINE = 24  # characters of a label line drawn; longer lines are cut


def _layers(g: nx.DiGraph) -> list[list[str]]:
    if nx.is_directed_acyclic_graph(g):
        return [sorted(layer) for layer in nx.topological_generations(g)]
    return [sorted(g.nodes)]  # never expected (a program is acyclic): one row, no crash


def _node_svg(x: float, y: float, data: dict) -> list[str]:
    lines = str(data.get("label", "")).split("\\n")
    failing = data.get("kind") == "op" and data.get("failing")
    if data.get("kind") == "op":
        fill, stroke = ("#f4a6a6", "#c00000") if failing else ("#ffffff", "#444444")
        shape = (f'<rect x="{x:.0f}" y="{y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="4" '
                 f'fill="{fill}" stroke="{stroke}"/>')
    else:
        fill = "#b7e1b0" if data.get("related") else "#dddddd"
        shape = (f'<ellipse cx="{x + NODE_W / 2:.0f}" cy="{y + NODE_H / 2:.0f}" rx="{NODE_W / 2}" '
                 f'ry="{NODE_H / 2}" fill="{fill}" stroke="#666666"/>')
    out = [f'<g class="node{" failing" if failing else ""}">', shape]
    first = y + NODE_H / 2 - (len(lines) - 1) * 6.5 + 4
    for i, text in enumerate(lines[:3]):
        text = text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"
        out.append(f'<text x="{x + NODE_W / 2:.0f}" y="{first + i * 13:.0f}" '
                   f'text-anchor="middle">{escape(text)}</text>')
    out.append("</g>")
    return out


def _panel(g: nx.DiGraph, title: str, x0: float, arrow: str) -> tuple[list[str], float, float]:
    """SVG elements of one program's graph from x0; returns them, its width and height."""
    layers = _layers(g)
    cols = max((len(layer) for layer in layers), default=1)
    width = cols * (NODE_W + GAP_X) - GAP_X
    pos: dict[str, tuple[float, float]] = {}
    for row, layer in enumerate(layers):
        offset = (width - (len(layer) * (NODE_W + GAP_X) - GAP_X)) / 2
        for col, n in enumerate(layer):
            pos[n] = (x0 + offset + col * (NODE_W + GAP_X), TITLE_H + PAD + row * (NODE_H + GAP_Y))
    out = [(f'<text class="panel-title" x="{x0:.0f}" y="{PAD + 4}" font-weight="bold">'
            f'{escape(title)} program</text>')]
    for a, b in g.edges():
        (xa, ya), (xb, yb) = pos[a], pos[b]
        out.append(f'<line x1="{xa + NODE_W / 2:.0f}" y1="{ya + NODE_H:.0f}" '
                   f'x2="{xb + NODE_W / 2:.0f}" y2="{yb:.0f}" stroke="#888888" '
                   f'marker-end="url(#{arrow})"/>')
    for n, data in g.nodes(data=True):
        out += _node_svg(*pos[n], data)
    height = TITLE_H + PAD + max(1, len(layers)) * (NODE_H + GAP_Y)
    return out, max(width, 200), height


def subgraphs_svg(graphs: dict[str, nx.DiGraph], title: str = "", uid: str = "") -> str:
    """One <svg> element: each program's failing subgraph, side by side. Its
    arrow marker's id is derived from `uid` (a page holds many drawings)."""
    arrow = "arrow-" + hashlib.sha256(uid.encode()).hexdigest()[:12]
    body: list[str] = []
    x, height = PAD, 0.0
    for name, g in graphs.items():
        if g.number_of_nodes() == 0:
            continue
        elements, w, h = _panel(g, name, x, arrow)
        body += elements
        x += w + 3 * GAP_X
        height = max(height, h)
    if not body:
        return ""
    width = x - 3 * GAP_X + PAD
    label = escape(f"failing subgraph of {title}" if title else "failing subgraph")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="subgraph" role="img" '
            f'aria-label="{label}" width="{width:.0f}" height="{height + PAD:.0f}" '
            f'viewBox="0 0 {width:.0f} {height + PAD:.0f}" font-family="Helvetica, sans-serif" '
            'font-size="11">'
            f'<defs><marker id="{arrow}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#888888"/>'
            '</marker></defs>' + "".join(body) + "</svg>")
