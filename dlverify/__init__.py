"""dlverify: prove a distributed ML program refines its sequential version.

Importing this package imports neither JAX nor the verifier (the CLI must set
XLA_FLAGS first, and its parent process only supervises): the names below are
loaded on first use.
"""
from dlverify.case import Case, case, host_mesh

__all__ = ["Case", "case", "host_mesh", "verify_jax", "verify_problem", "Result", "Failure"]


def __getattr__(name: str):
    if name in ("verify_jax", "verify_problem"):
        from dlverify import api
        return getattr(api, name)
    if name in ("Result", "Failure"):
        from dlverify import verdict
        return getattr(verdict, name)
    raise AttributeError(f"module 'dlverify' has no attribute {name!r}")
