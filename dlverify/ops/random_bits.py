"""Numeric semantics of rng_bit_generator: XLA's own generator, run through
`jax.lax.rng_bit_generator` on the CPU backend, so witnesses and rule tests see
the bits XLA computes (for `rng_default` those of the CPU backend: other
backends may define it differently, an assumption the HLO frontend lists).

JAX without x64 takes the u64[2] state as u32[4] (each word low half first, as
its own lowering bitcasts it) and returns the new state the same way; 64-bit
bits and other state sizes need x64, which is process-wide state the evaluator
must not switch: NotExecutable."""
from __future__ import annotations

import numpy as np

from dlverify.ops.dtypes import is_exact
from dlverify.ops.semantics import Call, NotExecutable

# the bit types JAX generates without x64 (it rejects signed ones)
_BITS = {"uint8", "uint16", "uint32"}


def rng_bit_generator(call: Call) -> np.ndarray:
    """Output 0: the new state; output 1: the bits (`bits_shape`, `bits_dtype`)."""
    import jax
    from jax import lax
    algorithm = {"rng_default": lax.RandomAlgorithm.RNG_DEFAULT,
                 "rng_three_fry": lax.RandomAlgorithm.RNG_THREE_FRY,
                 "rng_philox": lax.RandomAlgorithm.RNG_PHILOX}[call.params["algorithm"]]
    state = np.asarray(call.ins[0])
    if state.shape != (2,) or not is_exact(state):
        raise NotExecutable(f"rng_bit_generator of a {state.dtype}{list(state.shape)} state "
                            f"(only u64[2] is run)")
    words = state.astype(np.uint64)
    key = np.stack([words & np.uint64(0xFFFFFFFF), words >> np.uint64(32)], 1)
    key = key.astype(np.uint32).reshape(4)
    output = call.params["output"]
    # the new state counts the bits drawn: both outputs carry the bits' type
    bits_shape, bits_dtype = tuple(call.params["bits_shape"]), call.params["bits_dtype"]
    if bits_dtype not in _BITS:
        raise NotExecutable(f"rng_bit_generator of {bits_dtype} bits (run: u8, u16, u32)")
    with jax.default_device(jax.devices("cpu")[0]):
        new_key, bits = lax.rng_bit_generator(key, bits_shape, np.dtype(bits_dtype), algorithm)
    if output == 1:
        return np.asarray(bits)
    halves = np.asarray(new_key).astype(np.uint64).reshape(2, 2)
    return halves[:, 0] | (halves[:, 1] << np.uint64(32))
