"""Rendering of the rule-set research reports: rich tables, JSON and the heatmap SVG."""
from __future__ import annotations

import math
from html import escape

from rich.table import Table

from dlverify.rules.fuzz import CheckReport, view_text
from dlverify.rules.stats import StatsReport

MAX_MODEL_COLUMNS = 8  # beyond this the table shows totals only (the heatmap shows all)


def stats_table(report: StatsReport) -> Table:
    ok = [m for m in report.models if not m.error]
    per_model = len(ok) <= MAX_MODEL_COLUMNS
    table = Table(title=f"tuples derived per rule ({len(ok)} model(s), rules in {report.rules.folder})")
    table.add_column("rule", no_wrap=True)
    table.add_column("head")
    table.add_column("total", justify="right")
    table.add_column("models", justify="right")
    if per_model:
        for m in ok:
            table.add_column(m.name, justify="right")
    for r in report.rows():
        counts = [m.counts.get(r, 0) for m in ok]
        cells = [report.rules.name(r), r.head, str(report.total(r)), str(sum(1 for c in counts if c))]
        table.add_row(*cells, *([str(c) for c in counts] if per_model else []))
    return table


def check_lines(report: CheckReport) -> list[str]:
    rs = report.rules
    fired = [r for r in report.view_rules if report.fired.get(r)]
    lines = [f"rules check {rs.folder}: {report.trials} random program pairs "
             f"({report.refused} refused by the export or not executable), {report.checked_views} derived views checked "
             f"numerically, {report.wrong_views} wrong; {len(fired)} of {len(report.view_rules)} View "
             f"rules fired; {report.seconds:.1f}s"]
    for rule, cx in sorted(report.unsound.items(), key=lambda kv: (kv[0].file, kv[0].line)):
        lines += [f"UNSOUND {rs.name(rule)}: derives {view_text(cx.wrong.view)} from correct View "
                  f"premises; it is wrong by {cx.wrong.error:.3g} ({cx.wrong.how}) in trial "
                  f"{cx.trial} (--seed {cx.seed})",
                  "  premises: " + ("; ".join(view_text(v) for v in cx.premises) or "none (no View premise)"),
                  *("  " + line for line in cx.program.splitlines())]
    if not report.unsound:
        lines.append("no unsound rule found")
    never = [rs.name(r) for r in report.view_rules if not report.fired.get(r)]
    if never:
        lines.append(f"View rules never exercised by these trials: {', '.join(never)}")
    return lines


def check_json(report: CheckReport) -> dict:
    rs = report.rules
    return {
        "rules_dir": str(rs.folder), "rules_hash": rs.digest, "trials": report.trials,
        "refused": report.refused, "checked_views": report.checked_views,
        "wrong_views": report.wrong_views, "seconds": round(report.seconds, 3),
        "sound": report.sound,
        "fired": {rs.name(r): report.fired.get(r, 0) for r in report.view_rules},
        "unsound": [{"rule": rs.name(r), "head": r.head, "trial": cx.trial, "seed": cx.seed,
                     "view": view_text(cx.wrong.view), "error": cx.wrong.error, "how": cx.wrong.how,
                     "premises": [view_text(v) for v in cx.premises], "program": cx.program}
                    for r, cx in report.unsound.items()],
    }


CELL_W, CELL_H, LABEL_W, HEADER_H, PAD = 22, 12, 260, 150, 8


def _color(count: int, top: int) -> str:
    """White for 0, then light to dark blue on a log scale up to the largest count."""
    if count <= 0:
        return "#ffffff"
    t = math.log1p(count) / math.log1p(max(top, 1))
    r, g, b = (round(a + (z - a) * t) for a, z in ((222, 8), (235, 48), (247, 107)))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap_svg(report: StatsReport) -> str:
    """Rules (rows, most productive first) by models (columns); a cell's colour is the
    number of tuples the rule derived in the model on a log scale; hover for the number."""
    ok = [m for m in report.models if not m.error]
    rows = report.rows()
    top = max((m.counts.get(r, 0) for m in ok for r in rows), default=0)
    width = PAD * 2 + LABEL_W + CELL_W * max(1, len(ok)) + HEADER_H  # room for the slanted names
    height = PAD * 2 + HEADER_H + CELL_H * len(rows)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="9">',
           f'<title>tuples derived per rule and model (rules: {escape(str(report.rules.folder))})</title>',
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="{PAD}" y="{PAD + 10}">tuples derived per rule (rows) and model (columns)</text>',
           f'<text x="{PAD}" y="{PAD + 22}">colour: log(1 + n), darkest n = {top}; white: none</text>']
    x0, y0 = PAD + LABEL_W, PAD + HEADER_H
    for j, m in enumerate(ok):
        x = x0 + j * CELL_W + CELL_W // 2
        out.append(f'<text transform="translate({x},{y0 - 4}) rotate(-60)">{escape(m.name[:40])}</text>')
    for i, r in enumerate(rows):
        y = y0 + i * CELL_H
        label = f"{report.rules.name(r)} {r.head}"
        out.append(f'<text x="{x0 - 4}" y="{y + CELL_H - 3}" text-anchor="end">{escape(label[:48])}</text>')
        for j, m in enumerate(ok):
            n = m.counts.get(r, 0)
            out.append(f'<rect x="{x0 + j * CELL_W}" y="{y}" width="{CELL_W - 1}" height="{CELL_H - 1}" '
                       f'fill="{_color(n, top)}" stroke="#dddddd" stroke-width="0.5">'
                       f'<title>{escape(report.rules.name(r))} in {escape(m.name)}: {n}</title></rect>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
