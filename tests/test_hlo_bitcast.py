"""HLO bitcast-convert between integer types of any width (JAX's rbg PRNG keys:
u32[2,2] <-> u64[2]): evaluated as XLA does (checked against
jax.lax.bitcast_convert_type on CPU) and related as a whole function of its
operand (datalog/whole_fn.dl): equal integers have equal bits, so a replicated
key gives replicated bits (and random bits read as floats, jax.random's
uniform sampling, are replicated floats); a per-rank key does not. From a
float it stays unrelated outside sort comparators."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hlo_pairs import assert_pair_verifies, verify_texts  # noqa: E402
from jax import lax  # noqa: E402
from test_hlo_rng import mlp  # noqa: E402

from dlverify.errors import InputError, UnknownOpError  # noqa: E402
from dlverify.ops import evaluate  # noqa: E402


@pytest.mark.parametrize("src, dst, shape", [
    ("uint32", "uint8", (3, 2)), ("uint8", "uint32", (3, 4)), ("uint16", "uint32", (5, 2)),
    ("int32", "uint16", (4,)), ("uint32", "int32", (2, 3)), ("uint32", "float32", (6,)),
])
def test_evaluator_matches_xla(src, dst, shape):
    rng = np.random.default_rng(0)
    x = rng.integers(0, np.iinfo(src).max, size=shape, dtype=src, endpoint=True)
    if dst == "float32":          # finite floats only: the uniform-sampling mantissa trick
        x = (x >> 9) | np.uint32(0x3F800000)
    want = np.asarray(lax.bitcast_convert_type(jnp.asarray(x), jnp.dtype(dst)))
    got = evaluate("bitcast_convert", {"from": src}, [x], want.shape, dst)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


KEYED = ("  %s = u32[4]{0} parameter(0)\n  %s22 = u32[2,2]{1,0} reshape(u32[4]{0} %s)\n"
         "  %sk = u64[2]{0} bitcast-convert(u32[2,2]{1,0} %s22)\n")


def keyed(parts: int, state: str = "%sk") -> str:
    """test_hlo_rng's dropout MLP with its state read from a u32[4] key (rbg's)."""
    text = mlp(parts, state=state).replace("(s: u64[2],", "(s: u32[4],")
    return text.replace("  %s = u64[2]{0} parameter(0)\n", KEYED)


def test_a_replicated_key_gives_replicated_bits(tmp_path):
    res = verify_texts(tmp_path, keyed(1), keyed(2))
    assert res.verified, [f.message for f in res.failures[:2]]


def test_a_per_rank_key_is_not_verified(tmp_path):
    per_rank = keyed(2, state="%sk2").replace("  %rng = ", """  %pid = u32[] partition-id()
  %pidb = u32[4]{0} broadcast(u32[] %pid), dimensions={}
  %s2 = u32[4]{0} add(u32[4]{0} %s, u32[4]{0} %pidb)
  %s222 = u32[2,2]{1,0} reshape(u32[4]{0} %s2)
  %sk2 = u64[2]{0} bitcast-convert(u32[2,2]{1,0} %s222)
  %rng = """)
    res = verify_texts(tmp_path, keyed(1), per_rank)
    assert not res.verified


def test_a_shape_that_does_not_keep_the_bits_is_one_error(tmp_path):
    bad = keyed(2).replace("%sk = u64[2]{0} bitcast-convert", "%sk = u64[4]{0} bitcast-convert")
    line = next(i for i, text in enumerate(bad.splitlines(), 1) if "%sk = u64[4]" in text)
    with pytest.raises(InputError) as ei:
        verify_texts(tmp_path, keyed(1), bad)
    assert ei.value.file.endswith("dist.hlo") and ei.value.line == line
    assert "does not keep the bits" in ei.value.message


def _bits_as_floats(per_rank: bool) -> str:
    """jax.random's uniform sampling: u32 bits into a float's mantissa, read as f32."""
    shift = ("  %pid = u32[] partition-id()\n  %pb = u32[4]{0} broadcast(u32[] %pid), dimensions={}\n"
             "  %b = u32[4]{0} add(u32[4]{0} %s, u32[4]{0} %pb)\n" if per_rank
             else "  %b = u32[4]{0} copy(u32[4]{0} %s)\n")
    return f"""HloModule m, num_partitions=2

ENTRY %main (s: u32[4]) -> f32[4] {{
  %s = u32[4]{{0}} parameter(0)
{shift}  %nine = u32[] constant(9)
  %nb = u32[4]{{0}} broadcast(u32[] %nine), dimensions={{}}
  %m = u32[4]{{0}} shift-right-logical(u32[4]{{0}} %b, u32[4]{{0}} %nb)
  %one = u32[] constant(1065353216)
  %ob = u32[4]{{0}} broadcast(u32[] %one), dimensions={{}}
  %o = u32[4]{{0}} or(u32[4]{{0}} %m, u32[4]{{0}} %ob)
  ROOT %f = f32[4]{{0}} bitcast-convert(u32[4]{{0}} %o)
}}
"""


def test_integer_bits_read_as_floats_are_a_function_of_the_bits(tmp_path):
    seq = _bits_as_floats(False).replace("num_partitions=2", "num_partitions=1")
    ok = verify_texts(tmp_path, seq, _bits_as_floats(False))
    assert ok.verified and ok.outputs == ["out0 = r0.out0  (replicated on all 2 ranks)"]
    assert not verify_texts(tmp_path, seq, _bits_as_floats(True)).verified


def test_float_bits_outside_a_comparator_stay_unknown(tmp_path):
    text = """HloModule m, num_partitions=2

ENTRY %main (x: f32[4]) -> s32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %b = s32[4]{0} bitcast-convert(f32[4]{0} %x)
}
"""
    with pytest.raises(UnknownOpError, match="reinterprets the bits"):
        verify_texts(tmp_path, text, text)


def _sharded_bits_as_floats(ranks: int, n: int, dst: str = "f32") -> str:
    """Each rank's block of u32 bits read as floats (a dropout mask of an activation
    sharded by XLA: partitioned threefry bits per block), or as a narrower type."""
    width = {"f32": 1, "u16": 2}[dst]
    shape = f"{n}" if width == 1 else f"{n},2"
    dims = "{0}" if width == 1 else "{1,0}"
    shard = "" if ranks == 1 else ", sharding={devices=[2]<=[2]}"
    return f"""HloModule m, num_partitions={ranks}

ENTRY %main (s: u32[{n}]) -> {dst}[{shape}] {{
  %s = u32[{n}]{{0}} parameter(0){shard}
  %nine = u32[] constant(9)
  %nb = u32[{n}]{{0}} broadcast(u32[] %nine), dimensions={{}}
  %m = u32[{n}]{{0}} shift-right-logical(u32[{n}]{{0}} %s, u32[{n}]{{0}} %nb)
  ROOT %f = {dst}[{shape}]{dims} bitcast-convert(u32[{n}]{{0}} %m){shard}
}}
"""


def test_a_block_of_bits_read_as_floats_is_the_block_of_the_floats(tmp_path):
    """Between types of one width a bitcast is elementwise: blocks pass through it."""
    assert_pair_verifies(tmp_path, _sharded_bits_as_floats(1, 4), _sharded_bits_as_floats(2, 2),
                         ["out0 = concat(r0.out0, r1.out0; dim 0)"])


def test_a_block_of_bits_read_as_narrower_ints_is_not_elementwise(tmp_path):
    """u32 -> u16[.., 2] splits each element: a whole function only, so a block of the
    operand relates nothing (the sharded result stays unproved)."""
    res = verify_texts(tmp_path, _sharded_bits_as_floats(1, 4, "u16"),
                       _sharded_bits_as_floats(2, 2, "u16"))
    assert not res.verified
