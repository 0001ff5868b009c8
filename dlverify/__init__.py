"""dlverify: prove a distributed ML program refines its sequential version.

Importing this package does not import JAX (the CLI must set XLA_FLAGS first).
"""
from dlverify.api import verify_jax, verify_problem
from dlverify.case import Case, case, host_mesh
from dlverify.verdict import Failure, Result

__all__ = ["Case", "case", "host_mesh", "verify_jax", "verify_problem", "Result", "Failure"]
