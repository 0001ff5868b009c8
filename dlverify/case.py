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


def host_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    """A `jax.sharding.Mesh` (axis types Auto) over the first prod(shape) devices.

    The CLI provides 8 host CPU devices; elsewhere set
    XLA_FLAGS=--xla_force_host_platform_device_count=8 before importing JAX.
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    n = int(np.prod(shape))
    devices = jax.devices()
    if len(devices) < n:
        from dlverify.errors import InputError
        raise InputError(f"this case needs {n} devices but JAX sees {len(devices)}; set "
                           "XLA_FLAGS=--xla_force_host_platform_device_count=8 before importing jax")
    return Mesh(np.array(devices[:n]).reshape(shape), names)


def case(fn: Callable[[], Case]) -> Callable[[], Case]:
    """Mark a zero-argument function returning a `Case` as a verification case."""
    setattr(fn, CASE_MARKER, True)
    return fn
