"""bench/hlo_mutants.py, the soundness campaign on mutated compiled modules: the
mutations it enumerates, and that its check of a verified mutant's claims catches
a distributed module that does not compute what the verdict says."""
import importlib.util
import sys
from pathlib import Path

from dlverify.hlo_api import verify_hlo

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "mutants"
_spec = importlib.util.spec_from_file_location("_bench_hlo_mutants", ROOT / "bench" / "hlo_mutants.py")
mutants = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mutants   # dataclasses look their module up by name
_spec.loader.exec_module(mutants)

MODULE = """HloModule m, num_partitions=2

ENTRY %main (p: f32[4,4], q: f32[4,4]) -> f32[4,4] {
  %p = f32[4,4]{1,0} parameter(0), sharding={devices=[1,2]<=[2]}
  %q = f32[4,4]{1,0} parameter(1), sharding={devices=[1,2]<=[2]}
  %c = f32[] constant(0.5)
  %s = f32[4,4]{1,0} subtract(%p, %q)
  %lt = pred[4,4]{1,0} compare(%p, %q), direction=LT
  %t = f32[4,4]{1,0} transpose(%s), dimensions={1,0}
  %sl = f32[2,4]{1,0} slice(%t), slice={[1:3], [0:4]}
  %ar = f32[4,4]{1,0} all-reduce(%t), replica_groups={{0,1}}, to_apply=%sum
  %ag = f32[4,8]{1,0} all-gather(%t), replica_groups=[1,2]<=[2], dimensions={1}
  ROOT %m = f32[4,4]{1,0} multiply(%ar, %q)
}
"""


def _kinds_at(text):
    return {(m.kind, m.line) for m in mutants.mutations(text)}


def test_each_mutation_kind_is_enumerated_at_its_line():
    kinds = _kinds_at(MODULE)
    assert ("constant", 6) in kinds
    assert {("opcode", 7), ("operand-order", 7)} <= kinds             # subtract
    assert ("direction", 8) in kinds
    assert ("dimensions", 9) in kinds                                   # transpose {0,1}
    assert ("slice", 10) in kinds                                       # [0:2] along dim 0
    assert {("groups", 11), ("dropped-all-reduce", 11)} <= kinds
    assert ("groups", 12) in kinds                                      # iota groups split
    gathers = [m.text for m in mutants.mutations(MODULE) if (m.kind, m.line) == ("dimensions", 12)]
    assert sorted("dimensions={0}" in t for t in gathers) == [False, True]   # {0} and {2}
    assert ("wrong-operand", 7) in kinds                                # %p for %q (same shape)
    at_11 = [m for m in mutants.mutations(MODULE) if m.line == 11]
    groups = [m.text for m in at_11 if m.kind == "groups"]
    assert any("replica_groups={{0},{1}}" in t for t in groups)     # split in halves
    assert any("replica_groups={{1,0}}" in t for t in groups)       # members reordered
    dropped = [m.text for m in at_11 if m.kind == "dropped-all-reduce"]
    assert [t.strip() for t in dropped] == ["%ar = f32[4,4]{1,0} copy(%t)"]


def test_a_wrong_claim_is_caught(tmp_path):
    # the verdict on the correct pair, checked against the module with the gather
    # along the wrong dim: the claimed reconstruction does not hold numerically
    seq, dist = DATA / "jax_flatten_seq.hlo", DATA / "jax_flatten_dist.hlo"
    res = verify_hlo(seq, dist)
    assert res.verified
    holds, _ = mutants._claims_hold(seq, dist, res)
    assert holds
    holds, why = mutants._claims_hold(seq, DATA / "jax_flatten_wrong_gather_dim.hlo", res)
    assert not holds and why.startswith("output 0 rank 0")


def test_a_mutant_is_verified_or_refused_never_crashes(tmp_path):
    seq, dist = DATA / "jax_flatten_seq.hlo", DATA / "jax_flatten_dist.hlo"
    text = dist.read_text()
    outcomes = [mutants.run_mutant("flatten", seq, text, m, tmp_path) for m in mutants.mutations(text)]
    assert outcomes
    assert not [o for o in outcomes if o.result in ("CRASH", "UNSOUND")], outcomes
    assert any(o.result == "not verified" for o in outcomes)


def test_a_mutated_sequential_module_is_checked_the_same_way(tmp_path):
    seq, dist = DATA / "jax_flatten_seq.hlo", DATA / "jax_flatten_dist.hlo"
    text = seq.read_text()
    outcomes = [mutants.run_mutant("flatten", dist, text, m, tmp_path, side="seq")
                for m in mutants.mutations(text)]
    assert outcomes
    assert not [o for o in outcomes if o.result in ("CRASH", "UNSOUND")], outcomes
    assert any(o.result == "not verified" for o in outcomes)
