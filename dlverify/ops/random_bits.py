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


# ------------------------------------------------------------ JAX's key primitives
# The jaxpr frontend carries a typed PRNG key as its key data (u32[..., 2] for
# threefry), so these take and give key data; `impl` names the PRNG implementation
# (jax.random.key_impl). Each maps every key of a batch of keys alone, as JAX's
# primitives do: the batch dims lead, the key's own dims trail.

def _keyed(call: Call, fn, extra: tuple = ()) -> np.ndarray:
    """fn(key, *extra elements) over the batch of keys in operand 0 (key data whose
    last `key_rank` dims, a param, are one key's), by jax.vmap over the flattened batch."""
    import jax
    key_rank = int(call.params["key_rank"])
    data = np.asarray(call.ins[0], dtype=np.uint32)
    batch = data.shape[:data.ndim - key_rank]
    flat = data.reshape((-1,) + data.shape[data.ndim - key_rank:])
    args = [np.broadcast_to(np.asarray(e), batch).reshape(-1) for e in extra]
    impl = call.params["impl"]

    def one(kd, *xs):
        return fn(jax.random.wrap_key_data(kd, impl=impl), *xs)
    with jax.default_device(jax.devices("cpu")[0]):
        out = np.asarray(jax.vmap(one)(flat, *args))
    return out.reshape(batch + out.shape[1:])


def random_bits(call: Call) -> np.ndarray:
    """`bit_width` random bits of `shape` from each key (jax.random.bits)."""
    import jax
    width = int(call.params["bit_width"])
    if f"uint{width}" not in _BITS:
        raise NotExecutable(f"random_bits of width {width} (run: 8, 16, 32)")
    shape = tuple(call.params["shape"])
    return _keyed(call, lambda k: jax.random.bits(k, shape, np.dtype(f"uint{width}")))


def random_split(call: Call) -> np.ndarray:
    """Keys of `shape` split from each key (jax.random.split), as key data."""
    import jax
    shape = tuple(call.params["shape"])
    return _keyed(call, lambda k: jax.random.key_data(jax.random.split(k, shape)))


def random_fold_in(call: Call) -> np.ndarray:
    """Each key with its u32 message folded in (jax.random.fold_in), as key data."""
    import jax
    return _keyed(call, lambda k, m: jax.random.key_data(jax.random.fold_in(k, m)),
                  (np.asarray(call.ins[1], dtype=np.uint32),))


def random_seed(call: Call) -> np.ndarray:
    """The key data of a key seeded by each integer (jax.random.key)."""
    import jax
    seeds = np.asarray(call.ins[0])
    if seeds.dtype.itemsize > 4:
        raise NotExecutable(f"random_seed of a {seeds.dtype} seed (64-bit needs x64)")
    impl = call.params["impl"]
    with jax.default_device(jax.devices("cpu")[0]):
        out = jax.vmap(lambda s: jax.random.key_data(jax.random.key(s, impl=impl)))(
            seeds.reshape(-1))
    out = np.asarray(out)
    return out.reshape(seeds.shape + out.shape[1:])
