"""Reshaped parameter relations and relations found by trying candidates
(dlverify/trial.py, frontends/hlo/pairing.py; issue 12 items 2 and 3).

The data: tests/data/torch_xla/tp_mlp_flat_dist.hlo hands the column-parallel
weight over flattened (f32[256], its [16,16] block of the sequential [16,32]
split along dim 1), as a flat-parameter runtime does; its twin
tp_mlp_flat_dist_transposed.hlo uses the block transposed (the bug, line 15).
"""
from pathlib import Path

import numpy as np
import pytest

from dlverify.errors import InputError
from dlverify.hlo_api import hlo_problem, verify_hlo
from dlverify.ir import IdAllocator
from dlverify.numeric import run_both
from dlverify.relations import reshaped_split_dims
from dlverify.spec import parse_spec
from dlverify.spec_writer import infer_spec

TXLA = Path(__file__).parent / "data" / "torch_xla"
SEQ, FLAT, FLAT_BUG = (TXLA / "tp_mlp_seq.hlo", TXLA / "tp_mlp_flat_dist.hlo",
                       TXLA / "tp_mlp_flat_dist_transposed.hlo")


def test_reshaped_split_dims_lists_every_dim_with_the_element_count():
    assert reshaped_split_dims((16, 32), (256,), 2) == [0, 1]
    assert reshaped_split_dims((16, 32), (512,), 2) == [None]        # the whole value
    assert reshaped_split_dims((15, 32), (240,), 2) == [1]           # 15 does not split
    assert reshaped_split_dims((16, 32), (100,), 2) == []


def test_spec_reshaped_forms_parse_and_print_back():
    spec = parse_spec('[params]\n0 = { split = 1, reshaped = true }\n'
                      '1 = { replicated = true, reshaped = true, dist = 3 }\n', "s.toml")
    a, b = spec.params[0], spec.params[1]
    assert (a.kind, a.dim, a.reshaped) == ("split", 1, True)
    assert (b.kind, b.reshaped, b.dist) == ("replicated", True, 3)
    assert a.toml() == "{ split = 1, reshaped = true }"
    assert b.toml() == "{ replicated = true, reshaped = true, dist = 3 }"
    again = parse_spec(f"[params]\n0 = {a.toml()}\n1 = {b.toml()}\n", "t.toml")
    assert again.params[0].reshaped and again.params[1].reshaped


@pytest.mark.parametrize("line,says", [
    ('0 = { split = 1, reshaped = "yes" }', "reshaped must be true or false"),
    ('0 = { split = 1, reshaped = true, pad = "any" }', "not given with segments or pad"),
    ("0 = { split = 1, reshaped = true, segments = [8, 8] }", "not given with segments or pad"),
    ("0 = { rank0_only = true, reshaped = true }", "not given with rank0_only"),
])
def test_bad_reshaped_entries_name_the_line(line, says):
    with pytest.raises(InputError) as e:
        parse_spec(f"ranks = 2\n[params]\n{line}\n", "bad.toml")
    assert says in str(e.value) and e.value.line == 3


def test_flattened_weight_verifies_with_no_spec_by_trying_the_split_dims():
    res = verify_hlo(SEQ, FLAT)
    assert res.verified, res.failures[:1]
    [chosen] = [a for a in res.assumptions if "parameter 1 (p1.2, sequential" in a]
    assert "split along dim 1" in chosen and "candidate 2 of 2" in chosen
    assert "split along dim 0, reshaped" in chosen          # what it was chosen over


def test_reshaped_boundary_computes_what_the_sequential_program_does():
    """The reshape written into the distributed graph, run by the shared evaluator on
    inputs drawn under the chosen relation, gives the sequential output on every rank
    (the relation is right, not merely accepted by the rules)."""
    spec = parse_spec("[params]\n1 = { split = 1, reshaped = true }\n", "s.toml")
    problem = hlo_problem(SEQ, FLAT, spec, None, IdAllocator())
    run = run_both(problem, seed=3)
    [want] = run.seq[problem.seq.outputs[0]]
    got = run.dist[problem.dist.outputs[0]]
    assert len(got) == 2
    for rank_value in got:
        np.testing.assert_allclose(rank_value, want, rtol=1e-5, atol=1e-5)
    # the same pair under the other candidate (rows) computes something else
    rows = hlo_problem(SEQ, FLAT, parse_spec("[params]\n1 = { split = 0, reshaped = true }\n",
                                             "r.toml"), None, IdAllocator())
    wrong = run_both(rows, seed=3)
    assert np.abs(wrong.dist[rows.dist.outputs[0]][0] - wrong.seq[rows.seq.outputs[0]][0]).max() > 1e-2


def test_a_stated_relation_is_not_replaced_by_a_trial():
    spec = TXLA / "tp_mlp_flat_wrong_dim.toml"
    res = verify_hlo(SEQ, FLAT, spec)
    assert not res.verified
    assert not any("candidate" in a for a in res.assumptions)
    assert not any("candidate relations tried" in n for n in res.notes)


def test_reshaped_spec_with_the_wrong_element_count_is_exit_2():
    spec = parse_spec("[params]\n1 = { replicated = true, reshaped = true }\n", "s.toml")
    with pytest.raises(InputError) as e:
        hlo_problem(SEQ, FLAT, spec, None, IdAllocator())
    assert "different numbers of elements" in str(e.value)


def test_transposed_block_is_not_verified_under_any_candidate_and_located():
    res = verify_hlo(SEQ, FLAT_BUG)
    assert not res.verified
    assert res.failures[0].line == 15 and res.failures[0].file.endswith(FLAT_BUG.name)
    assert any("not verified under any of the candidate relations tried (2 verifications)" in n
               for n in res.notes)


def test_dlverify_spec_writes_the_reshaped_entry_and_it_verifies(tmp_path):
    inferred = infer_spec(SEQ, FLAT)
    assert inferred.verified
    assert "1 = { split = 1, reshaped = true }" in inferred.text
    path = tmp_path / "flat.toml"
    path.write_text(inferred.text)
    assert verify_hlo(SEQ, FLAT, path).verified
