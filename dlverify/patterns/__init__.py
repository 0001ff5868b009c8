"""Bug-pattern queries (README "Bug-pattern queries"): regular path patterns over the
labels of the distributed dataflow graph, compiled by pyformlang into minimal DFAs
(spec.py), evaluated as a product with the graph by datalog/patterns.dl (query.py)
after a failing verdict, and reported as explanations. The shipped patterns are the
*.toml files of this folder."""
from dlverify.patterns.alphabet import ALPHABET, VIEW_LABELS, op_labels
from dlverify.patterns.query import explain_failure, run_patterns
from dlverify.patterns.spec import (
                                    Pattern,
                                    compile_pattern,
                                    load_pattern_set,
                                    load_patterns,
                                    shipped_files,
)

__all__ = ["ALPHABET", "VIEW_LABELS", "Pattern", "compile_pattern", "explain_failure",
           "load_pattern_set", "load_patterns", "op_labels", "run_patterns", "shipped_files"]
