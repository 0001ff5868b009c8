"""HLO rng-bit-generator: lowered to the IR's rng_bit_generator (one op per
result), evaluated as XLA evaluates it (jax.lax.rng_bit_generator on CPU), and
related by datalog/whole_fn.dl only where the state is equal on both sides: a
replicated state gives replicated bits (a dropout mask in a tensor-parallel
MLP verifies); a state that differs per rank, another algorithm or another
bits shape is not verified and is located at its line; an unknown algorithm is
a one-line error, exit 2."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hlo_pairs import assert_pair_verifies, verify_texts  # noqa: E402
from jax import lax  # noqa: E402

from dlverify.errors import InputError  # noqa: E402
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module  # noqa: E402
from dlverify.interpret import Interpreter  # noqa: E402
from dlverify.ir import IdAllocator  # noqa: E402

RNG_LINE = 15        # the rng-bit-generator of `mlp`
PER_RANK_LINE = 18   # the add making PER_RANK's per-rank state

ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(f32[] %a, f32[] %b)
}
"""


def mlp(parts: int, algorithm: str = "rng_three_fry", state: str = "%s",
        bits: str = "u32[8,4]") -> str:
    """relu(x @ w) with dropout (keep where bits < 2^31) and a second output, the
    new state; with 2 parts x is split along dim 1 and w along dim 0 (row
    parallel), the partial products all-reduced."""
    k = 4 // parts
    reduce = ("  %h = f32[8,4]{1,0} all-reduce(f32[8,4]{1,0} %p), replica_groups={{0,1}}, "
              "to_apply=%add" if parts > 1 else "  %h = f32[8,4]{1,0} copy(f32[8,4]{1,0} %p)")
    return f"""HloModule m, num_partitions={parts}

{ADD}
ENTRY %main (s: u64[2], x: f32[8,{k}], w: f32[{k},4]) -> (f32[8,4], u64[2]) {{
  %s = u64[2]{{0}} parameter(0)
  %x = f32[8,{k}]{{1,0}} parameter(1)
  %w = f32[{k},4]{{1,0}} parameter(2)
  %p = f32[8,4]{{1,0}} dot(f32[8,{k}]{{1,0}} %x, f32[{k},4]{{1,0}} %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
{reduce}
  %rng = (u64[2]{{0}}, {bits}{{1,0}}) rng-bit-generator(u64[2]{{0}} {state}), algorithm={algorithm}
  %bits = {bits}{{1,0}} get-tuple-element((u64[2]{{0}}, {bits}{{1,0}}) %rng), index=1
  %next = u64[2]{{0}} get-tuple-element((u64[2]{{0}}, {bits}{{1,0}}) %rng), index=0
  %t = u32[] constant(2147483648)
  %tb = u32[8,4]{{1,0}} broadcast(u32[] %t), dimensions={{}}
  %keep = pred[8,4]{{1,0}} compare(u32[8,4]{{1,0}} %bits, u32[8,4]{{1,0}} %tb), direction=LT
  %z = f32[] constant(0)
  %zb = f32[8,4]{{1,0}} broadcast(f32[] %z), dimensions={{}}
  %y = f32[8,4]{{1,0}} select(pred[8,4]{{1,0}} %keep, f32[8,4]{{1,0}} %h, f32[8,4]{{1,0}} %zb)
  ROOT %out = (f32[8,4]{{1,0}}, u64[2]{{0}}) tuple(f32[8,4]{{1,0}} %y, u64[2]{{0}} %next)
}}
"""


PER_RANK = mlp(2, state="%s2").replace(
    "  %rng = ", """  %pid = u32[] partition-id()
  %pid64 = u64[] convert(u32[] %pid)
  %pidb = u64[2]{0} broadcast(u64[] %pid64), dimensions={}
  %s2 = u64[2]{0} add(u64[2]{0} %s, u64[2]{0} %pidb)
  %rng = """)


def lower(text: str):
    return hlo_to_graph(parse_hlo_module(text, "t.hlo"), IdAllocator(), "g")


def test_lines_are_where_the_tests_say():
    lines = mlp(1).splitlines()
    assert "rng-bit-generator" in lines[RNG_LINE - 1]
    assert "%s2 = u64[2]{0} add" in PER_RANK.splitlines()[PER_RANK_LINE - 1]


@pytest.mark.parametrize("algorithm,jax_algorithm", [
    ("rng_three_fry", lax.RandomAlgorithm.RNG_THREE_FRY),
    ("rng_philox", lax.RandomAlgorithm.RNG_PHILOX),
    ("rng_default", lax.RandomAlgorithm.RNG_DEFAULT)])
def test_evaluator_gives_xlas_bits_and_state(algorithm, jax_algorithm):
    g, info = lower(mlp(1, algorithm))
    state = np.array([7, 2**40 + 3], np.uint64)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    vals = Interpreter(g, 1).run([[state], [x], [w]])
    y, nxt = (vals[o][0] for o in g.outputs)
    # the same generator through JAX: the u64[2] state as u32[4], low half first
    key = np.array([7, 0, 3, 2**8], np.uint32)
    new_key, bits = lax.rng_bit_generator(key, (8, 4), np.uint32, jax_algorithm)
    new_key = np.asarray(new_key).astype(np.uint64)
    np.testing.assert_array_equal(nxt, new_key[0::2] | (new_key[1::2] << np.uint64(32)))
    keep = np.asarray(bits) < 2**31
    assert 0 < keep.sum() < keep.size   # a real mask, not all or nothing
    np.testing.assert_allclose(y, np.where(keep, x @ w, 0), rtol=1e-5, atol=1e-6)
    assert [a for a in info.assumptions if "rng-bit-generator" in a] == [
        (f"rng-bit-generator rng (t.hlo:{RNG_LINE}, {algorithm}) assumed to give the same bits "
         f"in both programs for the same state")]


def test_replicated_state_dropout_in_tp_mlp_verifies(tmp_path):
    res = assert_pair_verifies(tmp_path, mlp(1), mlp(2),
                               ["out0 = r0.out0  (replicated on all 2 ranks)",
                                "out1 = r0.out1  (replicated on all 2 ranks)"])
    assert sum("rng-bit-generator" in a for a in res.assumptions) == 2


@pytest.mark.parametrize("dist,line,what", [
    (PER_RANK, PER_RANK_LINE, "state + partition-id"),
    (mlp(2, algorithm="rng_philox"), RNG_LINE, "another algorithm"),
    (mlp(2).replace("%rng = (u64[2]{0}, u32[8,4]", "%rng = (u64[2]{0}, s32[8,4]")
     .replace("%bits = u32", "%bits = s32").replace("(u64[2]{0}, u32[8,4]{1,0}) %rng",
                                                  "(u64[2]{0}, s32[8,4]{1,0}) %rng")
     .replace("compare(u32[8,4]{1,0} %bits", "compare(s32[8,4]{1,0} %bits")
     .replace("%tb = u32", "%tb = s32").replace("%t = u32[] constant(2147483648)",
                                                "%t = s32[] constant(0)")
     .replace("broadcast(u32[] %t)", "broadcast(s32[] %t)"), RNG_LINE, "other bits type")])
def test_unequal_generators_are_not_verified_and_located(tmp_path, dist, line, what):
    res = verify_texts(tmp_path, mlp(1), dist)
    assert not res.verified, what
    assert (res.failures[0].file, res.failures[0].line) == (str(tmp_path / "dist.hlo"), line), \
        [(f.line, f.message) for f in res.failures[:3]]


def test_sharded_bits_are_not_the_sequential_bits(tmp_path):
    """Each rank drawing its own [8,2] columns from the replicated state is not
    a column block of the sequential [8,4] draw (the bits differ numerically)."""
    seq = mlp(1)
    dist = seq.replace("num_partitions=1", "num_partitions=2")   # column parallel: w split
    for full, half in [("[4,4]", "[4,2]"), ("[8,4]", "[8,2]")]:
        dist = dist.replace(full, half)
    for x_decl in ["x: f32[8,", "%x = f32[8,", "dot(f32[8,"]:
        dist = dist.replace(x_decl + "2]", x_decl + "4]")
    res = verify_texts(tmp_path, seq, dist)
    assert not res.verified
    assert res.failures[0].line == RNG_LINE, [(f.line, f.message) for f in res.failures[:3]]
    g_seq, _ = lower(seq)
    g_dist, _ = lower(dist)
    state = np.array([7, 9], np.uint64)
    x = np.ones((8, 4), np.float32)
    w = np.ones((4, 4), np.float32)
    ys = Interpreter(g_seq, 1).run([[state], [x], [w]])[g_seq.outputs[0]][0]
    yd = Interpreter(g_dist, 1).run([[state], [x], [w[:, :2]]])[g_dist.outputs[0]][0]
    assert not np.array_equal(ys[:, :2], yd)


@pytest.mark.parametrize("bad,msg", [
    ("algorithm=rng_three_fry", "algorithm 'rng_mersenne' is not one of"),
    (", algorithm=rng_three_fry", "algorithm '(none)' is not one of")])
def test_unknown_algorithm_is_one_line_naming_the_line(bad, msg):
    text = mlp(1).replace(bad, "algorithm=rng_mersenne" if "=" in bad and "," not in bad else "")
    with pytest.raises(InputError) as ei:
        lower(text)
    assert (ei.value.file, ei.value.line) == ("t.hlo", RNG_LINE)
    assert msg in ei.value.message and "\n" not in str(ei.value)


def test_cli_unknown_algorithm_exit_2(tmp_path):
    from typer.testing import CliRunner

    from dlverify.cli import app
    path = tmp_path / "m.hlo"
    path.write_text(mlp(1, algorithm="rng_mersenne"))
    r = CliRunner().invoke(app, ["check", str(path), str(path), "--ranks", "1"])
    assert r.exit_code == 2
    assert f"{path}:{RNG_LINE}:" in r.output and "rng_mersenne" in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("bits_dtype", ["uint64", "int32"])
def test_bits_jax_cannot_draw_without_x64_are_not_executable(bits_dtype):
    """64-bit bits need JAX's process-wide x64 switch, signed ones JAX refuses:
    the evaluator says NotExecutable (witnesses report it) instead of guessing."""
    from dlverify.ops import NotExecutable, evaluate
    params = {"algorithm": "rng_three_fry", "output": 1, "bits_shape": (3,),
              "bits_dtype": bits_dtype}
    with pytest.raises(NotExecutable):
        evaluate("rng_bit_generator", params, [np.array([1, 2], np.uint64)], (3,), bits_dtype)
