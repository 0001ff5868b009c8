"""dlverify: prove a distributed ML program refines its sequential version."""
from dlverify.case import Case, case

__all__ = ["Case", "case"]
