"""Where the first failure of a compiled module points (dlverify/diagnosis.py,
dlverify/diagnosis_origin.py, dlverify/diagnosis_outputs.py): XLA's optimisations
move the evidence away from the op the user got wrong.

- A partial sum returned unreduced: the sequential module (before optimisations)
  still reshapes the sum and reduces the size-1 dim, which the compiled one folded
  away; that sequential op finds no complete value to match, but the relation was
  lost where the partial sum was made, so the output's failure comes first.
- A collective's sum of local means divided by the wrong amount after it: the
  division is where the factor goes wrong (the collective itself is never blamed:
  the division belongs after it), even when XLA folds it into a later literal.
- A wrong reshape that XLA writes as a bitcast (carrying the metadata of the dot
  that made its operand) next to a transpose carrying the reshape's metadata.

Each pair has a correct twin that verifies: the diagnosis never changes a verdict."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from conftest import bug_line
from hlo_pairs import compiled_pair, verify_texts
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.diagnosis_origin import own_loc, primitives
from dlverify.ir import Frame, Op, SourceLoc

DP = 2
f32 = jnp.float32


def _located(tmp_path, seq, dist, args):
    """The verdict on the compiled pair, and its first failure."""
    res = verify_texts(tmp_path, *compiled_pair(dlverify.Case(seq=seq, dist=dist, args=args,
                                                              expect="bug"), dumped=True))
    return res, (res.failures[0] if res.failures else None)


def _frames(f) -> set[int]:
    return {fr.line for fr in f.frames if fr.file.endswith("test_diagnosis_compiled.py")}


def _dp(local, in_specs, out_specs, check_vma=True):
    mesh = dlverify.host_mesh((DP,), ("dp",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=check_vma))


# ------------------------------------------------ a partial sum returned unreduced

def column_sums_seq(x):
    return jnp.sum(jnp.sum(x, axis=0).reshape(1, 4), axis=0)


def column_sums_ok(x):
    return jax.lax.psum(jnp.sum(jnp.sum(x, axis=0).reshape(1, 4), axis=0), "dp")


def column_sums_bug(x):   # (returned as replicated: check_vma off below)
    return jnp.sum(jnp.sum(x, axis=0).reshape(1, 4), axis=0)  # BUG: never psum'd


ROWS = (jax.ShapeDtypeStruct((8, 4), f32),)


def test_a_partial_sum_returned_unreduced_is_reported_where_it_is_made(tmp_path):
    ok, _ = _located(tmp_path, column_sums_seq, _dp(column_sums_ok, (P("dp"),), P()), ROWS)
    assert ok.verified
    res, first = _located(tmp_path, column_sums_seq,
                          _dp(column_sums_bug, (P("dp"),), P(), check_vma=False), ROWS)
    assert not res.verified
    assert first.kind == "unreduced-partial" and "never reduced" in first.message, \
        [(f.op, f.kind, f.message[:120]) for f in res.failures]
    assert bug_line(column_sums_bug) in _frames(first)
    # the sequential sum over the size-1 row is the reshape deleting it in the normal form
    # (unit_placement.unit_reduction_as_reshape), which the rank's reshape matches:
    # nothing sequential is left unmatched, and the partial sum is the one failure
    assert res.failures == [first]


# ------------------------------- a collective's sum divided by the wrong amount

def rms_seq(x):
    g = jnp.mean(x, axis=0)
    return jnp.sqrt(0.5 * g * g + 1.0)


def rms_ok(x):
    g = jax.lax.psum(jnp.mean(x, axis=0), "dp") / DP
    return jnp.sqrt(0.5 * g * g + 1.0)


def rms_bug(x):
    g = jax.lax.psum(jnp.mean(x, axis=0), "dp") / (DP * DP)  # BUG: divided by the world size twice
    return jnp.sqrt(0.5 * g * g + 1.0)


def test_a_sum_divided_by_the_wrong_factor_is_reported_at_the_division(tmp_path):
    ok, _ = _located(tmp_path, rms_seq, _dp(rms_ok, (P("dp"),), P()), ROWS)
    assert ok.verified
    res, first = _located(tmp_path, rms_seq, _dp(rms_bug, (P("dp"),), P()), ROWS)
    assert not res.verified
    assert first.kind == "scale-mismatch", [(f.op, f.kind, f.message[:160]) for f in res.failures]
    assert bug_line(rms_bug) in _frames(first), (first.op, first.message)
    assert "turns the result of all_reduce" in first.message and "still 1/" in first.message


def test_a_missing_division_after_the_collective_names_no_division(tmp_path):
    """No op rescales the sum: the collective summing the local means is named, as
    nothing after it divides (diagnosis_origin.unscaled_sum)."""
    def rms_missing(x):
        g = jax.lax.psum(jnp.mean(x, axis=0), "dp")  # BUG: the mean of the means needs / DP
        return jnp.sqrt(0.5 * g * g + 1.0)

    res, first = _located(tmp_path, rms_seq, _dp(rms_missing, (P("dp"),), P()), ROWS)
    assert not res.verified
    assert "turns the result of" not in first.message
    assert "nothing after it divides" in first.message, first.message
    assert bug_line(rms_missing) in _frames(first)


def mean_seq(x):
    return jnp.mean(x, axis=0)


def mean_bug(x):
    return jax.lax.psum(jnp.mean(x, axis=0), "dp") / (DP * DP)  # BUG: divided by DP twice


def test_an_output_only_scaled_says_its_factor_without_an_expected_relation(tmp_path):
    """An HLO pair gives no expected output relation; an output whose views are all
    scaled is reported as scaled, not as lacking a relation."""
    res, first = _located(tmp_path, mean_seq, _dp(mean_bug, (P("dp"),), P()), ROWS)
    assert not res.verified
    assert first.kind == "scale-mismatch" and "1/2 times the sequential value" in first.message, \
        [(f.op, f.kind, f.message[:160]) for f in res.failures]
    assert bug_line(mean_bug) in _frames(first)


# ------------------------------------------ a reshape XLA writes as a bitcast

SEQ, D, H, HD = 8, 16, 4, 4


def heads_seq(x, w):
    q = (x @ w).reshape(SEQ, H, HD)
    return jnp.exp(jnp.einsum("qhd,khd->hqk", q, q))


def heads_ok(x, w):
    q = (x @ w).reshape(SEQ, H // DP, HD)
    return jnp.exp(jnp.einsum("qhd,khd->hqk", q, q))


def heads_bug(x, w):
    q = x @ w
    q = q.reshape(SEQ, H, -1)  # BUG: the global head count on a local shard
    return jnp.exp(jnp.einsum("qhd,khd->hqk", q, q))


HEADS_ARGS = (jax.ShapeDtypeStruct((SEQ, D), f32), jax.ShapeDtypeStruct((D, H * HD), f32))


def test_a_wrong_reshape_compiled_to_a_bitcast_is_reported_at_the_reshape(tmp_path):
    specs = ((P(), P(None, "dp")), P("dp"))
    ok, _ = _located(tmp_path, heads_seq, _dp(heads_ok, *specs), HEADS_ARGS)
    assert ok.verified
    res, first = _located(tmp_path, heads_seq, _dp(heads_bug, *specs), HEADS_ARGS)
    assert not res.verified
    assert bug_line(heads_bug) in _frames(first), \
        [(f.op, sorted(_frames(f)), f.message[:120]) for f in res.failures[:3]]


def test_own_loc_takes_the_neighbour_whose_metadata_names_the_op():
    def loc(line, name):
        return SourceLoc((Frame("m.hlo", line, "ins"), Frame("u.py", line + 100)), name)

    made = Op(0, "dot_general", [0], 1, loc=loc(1, "f/dot_general"))
    bitcast = Op(1, "reshape", [1], 2, loc=loc(2, "f/dot_general"))
    moved = Op(2, "transpose", [2], 3, loc=loc(3, "f/reshape"))
    got = own_loc(bitcast, {2: [moved]}, {1: made})
    assert [f.line for f in got.frames] == [2, 103]   # its own instruction, the reshape's source
    # its own metadata names it, or no neighbour's does, or two do: its own location
    named = Op(1, "reshape", [1], 2, loc=loc(2, "f/reshape"))
    assert own_loc(named, {2: [moved]}, {1: made}) == named.loc
    assert own_loc(bitcast, {}, {1: made}) == bitcast.loc
    elsewhere = Op(3, "transpose", [2], 4, loc=loc(5, "f/reshape"))
    assert own_loc(bitcast, {2: [moved, elsewhere]}, {1: made}) == bitcast.loc
    # two neighbours written at one place (a reshape read twice): that place
    again = Op(3, "transpose", [2], 4, loc=SourceLoc((Frame("m.hlo", 7, "ins"), Frame("u.py", 103)),
                                                     "f/reshape"))
    assert [f.line for f in own_loc(bitcast, {2: [moved, again]}, {1: made}).frames] == [2, 103]
    assert primitives("jit(f)/transpose(jvp())/mul;jit(f)/broadcast_in_dim") == \
        {"mul", "broadcast_in_dim"}
