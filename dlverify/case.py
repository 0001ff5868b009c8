"""`@dlverify.case`: how a Python file declares what `dlverify check-jax` runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

Expect = Literal["verified", "bug"]


@dataclass
class Case:
    """A sequential reference, its distributed version and example arguments.

    `args` may be arrays or `jax.ShapeDtypeStruct`s; no data is needed.
    `expect` is what the case's author claims; a case without it must verify.
    """

    seq: Callable[..., Any]
    dist: Callable[..., Any]
    args: tuple[Any, ...]
    expect: Expect = "verified"
    name: str = ""
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)


CASE_MARKER = "__dlverify_case__"


def case(fn: Callable[[], Case]) -> Callable[[], Case]:
    """Mark a zero-argument function returning a `Case` as a verification case."""
    setattr(fn, CASE_MARKER, True)
    return fn
