"""dlverify: prove a distributed ML program refines its sequential version.

Importing this package does not import JAX (the CLI must set XLA_FLAGS first).
"""
from dlverify.api import verify_jax, verify_problem
from dlverify.case import Case, case
from dlverify.verdict import Failure, Result

__all__ = ["Case", "case", "verify_jax", "verify_problem", "Result", "Failure"]
