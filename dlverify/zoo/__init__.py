"""`dlverify zoo`: verify many items (case files, HLO pairs, XLA dump folders) on
a local pool of supervised child processes, with a content-hash cache, a resume
journal, and aggregate reports (JSON, JUnit, SARIF, one static HTML page).

Modules, in the order a run uses them:
- items: the manifest (TOML) and the paths and globs the command line names -> entries
- cache: content keys, the verdict cache and the resume journal
- tasks: what runs in a child (list a file's cases, verify an item, with the details
  the HTML page shows and the Python files the item imported)
- runner: the pool (threads, each waiting on one dlverify.supervise child), the run's results
- ray_backend: --ray, the same children run by Ray tasks on a cluster's workers
- display: the rich progress bar and live table, or one line per item
- svg, html, outputs: the failing subgraph as inline SVG, the HTML page, the report files

The parent process stays light: it imports neither JAX nor the verifier.
"""
from dlverify.zoo.runner import ZooOptions, ZooRun, run_zoo

__all__ = ["ZooOptions", "ZooRun", "run_zoo"]
