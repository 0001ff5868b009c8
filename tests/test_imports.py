"""The module structure: no import cycles among dlverify's modules, and the
renderers (dlverify/reports/) depend on the result model, not on the runners."""
import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
# Source folder of each package (frontends/ is installed as dlverify.frontends).
PACKAGES = {"dlverify": ROOT / "dlverify", "dlverify.frontends": ROOT / "frontends"}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            mods[".".join((pkg,) + rel)] = path
    return mods


def _top_level_imports(path: Path, module: str, known: set[str]) -> set[str]:
    """Modules of `known` imported at module level (not inside functions, which
    run later, nor under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
                continue
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)
                continue
            else:
                continue
            for name in names:
                # importing a.b.c runs a, a.b and a.b.c
                parts = name.split(".")
                out.update(m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                           if m in known and m != module)

    visit(tree.body)
    return out


def import_graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for dep in _top_level_imports(path, name, set(mods)):
            g.add_edge(name, dep)
    return g


def test_the_scan_sees_the_package():
    g = import_graph()
    assert "dlverify.verdict" in g and "dlverify.reports.sarif" in g and "dlverify.frontends.jaxpr" in g
    assert g.has_edge("dlverify.diagnosis", "dlverify.verdict")


def test_no_import_cycles():
    g = import_graph()
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    cycles = [c for c in nx.simple_cycles(g)
              if not any(b.startswith(a + ".") for a in c for b in c)]
    assert cycles == [], f"import cycles: {cycles}"


def test_reports_depend_on_the_result_model_only():
    g = import_graph()
    # dlverify/__init__.py is the public API facade (it imports the runners); every
    # submodule's import runs it, so it is not what a module depends on.
    g.remove_node("dlverify")
    reports = [m for m in g if m.startswith("dlverify.reports")]
    assert len(reports) >= 6
    allowed = {"dlverify.verdict", "dlverify.schema", "dlverify.ir", "dlverify.problem",
               "dlverify.relations", "dlverify.errors", "dlverify.case"}
    for m in reports:
        # the IR's op-kind table (dlverify/ops/) is part of the IR the result refers to
        reach = {d for d in nx.descendants(g, m) - set(reports) if not d.startswith("dlverify.ops")}
        assert reach <= allowed, f"{m} depends on {sorted(reach - allowed)}"
