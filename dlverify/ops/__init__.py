"""IR op kinds in one table (`table.KINDS`): arity, family and algebraic class,
numpy semantics (semantics.py, structural.py), fact exporter (export.py); and
the one evaluator built on it (evaluate.py)."""
from dlverify.ops.dtypes import exact_dtype, is_float_dtype
from dlverify.ops.evaluate import evaluate, evaluate_ranks
from dlverify.ops.semantics import NotExecutable
from dlverify.ops.table import KINDS, RANK_OPAQUE, Algebra, Arity, Family, OpKind, data_operands, kinds

__all__ = ["KINDS", "Algebra", "Arity", "Family", "NotExecutable", "OpKind", "RANK_OPAQUE", "evaluate",
           "evaluate_ranks", "exact_dtype", "is_float_dtype", "kinds"]
