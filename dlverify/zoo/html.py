"""The zoo's static HTML report: one self-contained page (inline CSS, SVG and a
few lines of script, nothing fetched). One row per item: its verdict, the
expectation, status, time, whether the cache served it, and its first failure
with the source line; a details row below it with the proved reconstructions,
the assumptions and the failing subgraph drawn as inline SVG. The script counts
the rows by status and filters them; the page reads fine without it."""
from __future__ import annotations

from html import escape

from dlverify.zoo.results import ItemResult

STATUS_WORDS = {"ok": "verified", "expected": "bug found as expected",
                "mismatch": "MISMATCH", "error": "ERROR"}

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
tr.item.status-ok td.status { color: #17692b; }
tr.item.status-expected td.status { color: #285ea8; }
tr.item.status-mismatch td.status, tr.item.status-error td.status { color: #b00020; font-weight: bold; }
tr.detail td { border-bottom: 2px solid #ccc; }
pre.source { background: #f7f7f7; margin: 4px 0 0; padding: 2px 6px; white-space: pre-wrap; }
.failure { max-width: 48em; }
.cached { color: #777; }
#filters button { margin-right: 4px; }
#filters button.active { font-weight: bold; }
details svg { display: block; margin-top: 6px; max-width: 100%; height: auto; }
ul { margin: 2px 0; }
"""

SCRIPT = """
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr.item"));
  var counts = {all: rows.length, ok: 0, expected: 0, mismatch: 0, error: 0};
  rows.forEach(function (r) { counts[r.dataset.status] += 1; });
  var out = document.getElementById("rendered-counts");
  out.textContent = rows.length + " items: " + counts.ok + " verified, " + counts.expected +
    " bugs found as expected, " + counts.mismatch + " mismatches, " + counts.error + " errors";
  out.dataset.items = String(rows.length);
  var bar = document.getElementById("filters");
  ["all", "ok", "expected", "mismatch", "error"].forEach(function (status) {
    var b = document.createElement("button");
    b.type = "button";
    b.textContent = status + " (" + counts[status] + ")";
    b.dataset.status = status;
    b.addEventListener("click", function () {
      rows.forEach(function (r) {
        var show = status === "all" || r.dataset.status === status;
        r.hidden = !show;
        r.nextElementSibling.hidden = !show;
      });
      Array.prototype.forEach.call(bar.children, function (x) {
        x.classList.toggle("active", x === b);
      });
    });
    bar.appendChild(b);
  });
})();
"""


def _row(r: ItemResult) -> list[str]:
    d = r.detail
    failure = ""
    if r.error:
        failure = escape(r.error)
    elif d.first_failure:
        failure = escape(d.first_failure)
        if d.source_text:
            failure += (f'<pre class="source">{escape(d.source_file.rsplit("/", 1)[-1])}:'
                        f'{d.source_line}: {escape(d.source_text)}</pre>')
    out = [(f'<tr class="item status-{r.status}" data-status="{r.status}" '
            f'data-verdict="{escape(r.verdict)}" data-id="{escape(r.id)}">'),
           f'<td class="id">{escape(r.id)}</td>',
           f'<td class="kind">{escape(r.kind)}</td>',
           f'<td class="verdict">{escape(r.verdict)}</td>',
           f'<td class="expect">{escape(r.expect)}</td>',
           f'<td class="status">{escape(STATUS_WORDS.get(r.status, r.status))}'
           + (f" ({escape(r.error_kind.replace('_', ' '))})" if r.error_kind else "") + "</td>",
           f'<td class="time">{r.seconds:.2f}s</td>',
           f'<td class="cached">{"cached" if r.cached else ""}</td>',
           f'<td class="failure">{failure}</td>', "</tr>"]
    parts = []
    if d.outputs:
        parts.append("<p>Outputs:</p><ul>" + "".join(f"<li><code>{escape(o)}</code></li>"
                                                    for o in d.outputs) + "</ul>")
    parts.append("<p>Assumptions:</p>" + ("<ul class=\"assumptions\">" + "".join(
        f"<li>{escape(a)}</li>" for a in d.assumptions) + "</ul>" if d.assumptions
        else "<p class=\"assumptions\">none</p>"))
    if d.svg:
        parts.append(d.svg)  # made by dlverify/zoo/svg.py: every text in it is escaped
    elif d.svg_note:
        parts.append(f"<p>{escape(d.svg_note)}</p>")
    summary = "details" + (" and failing subgraph" if d.svg else "")
    out.append(f'<tr class="detail"><td colspan="8"><details><summary>{summary}</summary>'
               + "".join(parts) + "</details></td></tr>")
    return out


def zoo_html(results: list[ItemResult], summary: str, title: str = "dlverify zoo report") -> str:
    rows: list[str] = []
    for r in results:
        rows += _row(r)
    head = ("<tr><th>item</th><th>kind</th><th>verdict</th><th>expected</th><th>status</th>"
            "<th>time</th><th>cache</th><th>first failure</th></tr>")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>", f"<style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>", f'<p id="summary">{escape(summary)}</p>',
        '<p id="rendered-counts"></p>', '<div id="filters"></div>',
        f'<table id="items"><thead>{head}</thead><tbody>', *rows, "</tbody></table>",
        f"<script>{SCRIPT}</script>", "</body></html>", ""])
