"""Renderers of verdicts. Each depends on the result model (dlverify.verdict) only:

- text: the lines `dlverify` prints, one status line per case then details
- json_report: the versioned JSON report (schema in dlverify/schemas/)
- sarif: SARIF 2.1.0, so CI annotates the failing source lines
- junit: JUnit XML, one testcase per case
- graph: the failing subgraph as networkx graphs, DOT and (with Graphviz) SVG
- explain: `--explain`, a derivation rebuilt from the derived views
"""
