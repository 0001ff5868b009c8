"""Issue 5: proofs that can be explained, failures with subgraphs and numeric
witnesses, and machine-readable reports that validate against their schemas."""
import json
import shutil
from importlib import resources
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import pytest

from conftest import bug_line, example_targets
from dlverify.reports.explain import explain
from dlverify.reports.graph import failing_subgraphs, to_dot, write_graph
from dlverify.reports.json_report import outcomes_json
from dlverify.reports.junit import junit_xml
from dlverify.reports.sarif import sarif_log
from dlverify.reports.text import outcome_text
from dlverify.verdict import FAILURE_KINDS, CaseOutcome
from dlverify.witness import witness

TARGETS = example_targets()


def _schema(name):
    return json.loads(resources.files("dlverify").joinpath("schemas", name).read_text())


@pytest.fixture(scope="module")
def outcomes(example_runs):
    """Every example's outcome, from the session's runs (conftest.ExampleRuns)."""
    out = []
    for path, name in TARGETS:
        run = example_runs.run(path, name)
        c, res = run.case, run.result
        o = CaseOutcome(name, str(path), c.expect, res, seconds=0.1)
        o.bug_line = bug_line(c.dist) if c.expect == "bug" else None
        out.append(o)
    return out


def test_every_correct_example_is_explained_back_to_its_inputs(outcomes):
    for o in outcomes:
        if o.expect != "verified":
            continue
        for rank in range(o.result.problem.mesh.size):
            lines = explain(o.result, "out0", rank)
            assert lines[0].startswith(f"rank {rank}: out0 = "), lines[0]
            assert any("input relation" in line for line in lines), (o.name, lines)
            assert not any("constant or iota" in line and "in0" in line for line in lines)


def test_explain_rejects_unknown_outputs(outcomes):
    with pytest.raises(ValueError, match="no output named"):
        explain(outcomes[0].result, "logits")


def test_failures_carry_frames_views_and_a_kind(outcomes):
    for o in outcomes:
        if o.expect != "bug":
            continue
        first = o.result.failures[0]
        assert first.kind != "no-relation" or first.reason == "", (o.name, first)
        # reported at one of its frames (the innermost, or a caller: frontends/jaxpr/frames.py)
        assert (first.file, first.line) in {(fr.file, fr.line) for fr in first.frames}
        assert first.operand_views, o.name
        assert o.bug_line in {fr.line for fr in first.frames}


def test_reasons_name_the_recognised_patterns(outcomes):
    kinds = {o.name: o.result.failures[0].kind for o in outcomes if o.expect == "bug"}
    assert kinds["megatron_mlp_bug_missing_psum"] == "unreduced-partial"
    assert kinds["megatron_mlp_bug_bias_before_psum"] == "partial-plus-complete"
    assert kinds["megatron_mlp_bug_gelu_on_partial_sum"] == "nonlinear-on-partial"
    assert kinds["mesh_2d_bug_psum_wrong_axis"] == "wrong-group"
    assert kinds["dp_grad_bug_psum_no_divide"] == "scale-mismatch"
    assert kinds["sequence_parallel_mlp_bug_gather_wrong_dim"] == "not-adjacent"
    assert kinds["ring_shift_bug_wrong_direction"] == "wrong-block"
    scale = next(o for o in outcomes if o.name == "dp_grad_bug_psum_no_divide").result.failures[0]
    assert "scale differs by 4" in scale.message


def test_witness_confirms_every_bug_and_no_correct_case(outcomes):
    for o in outcomes:
        w = witness(o.result, seed=3)
        assert w.ran, w.note
        assert w.confirmed == (o.expect == "bug"), (o.name, w.summary())
        if o.expect == "bug":
            assert "confirmed numerically" in w.summary()


def test_witness_refuses_shapes_too_large_for_memory(outcomes):
    w = witness(outcomes[0].result, max_bytes=1000)
    assert not w.ran and "GiB of values" in w.note and "not run" in w.summary()


def test_failing_subgraph_highlights_the_failing_ops(outcomes, tmp_path):
    o = next(o for o in outcomes if o.name == "megatron_mlp_bug_bias_before_psum")
    graphs = failing_subgraphs(o.result)
    failing = [n for n, d in graphs["distributed"].nodes(data=True) if d.get("failing")]
    assert failing, "the failing op is not in the subgraph"
    labels = [graphs["distributed"].nodes[n]["label"] for n in failing]
    assert any(f"megatron_mlp.py:{o.bug_line}" in label for label in labels)
    dot = to_dot(graphs, o.name)
    assert dot.startswith("digraph") and "fillcolor=\"#f4a6a6\"" in dot
    note = write_graph(o.result, tmp_path / "g.dot")
    assert (tmp_path / "g.dot").read_text() == dot and "wrote" in note


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_failing_subgraph_renders_to_svg(outcomes, tmp_path):
    o = next(o for o in outcomes if o.name == "megatron_mlp_bug_bias_before_psum")
    write_graph(o.result, tmp_path / "g.svg")
    svg = (tmp_path / "g.svg").read_text()
    assert "<svg" in svg and "megatron_mlp.py" in svg


def test_json_report_validates_against_its_schema(outcomes):
    doc = json.loads(outcomes_json(outcomes))
    jsonschema.validate(doc, _schema("report-v1.schema.json"))
    assert doc["schema_version"] == 1 and len(doc["cases"]) == len(outcomes)


def test_sarif_validates_and_points_at_the_bug_lines(outcomes):
    log = sarif_log(outcomes, root=Path(__file__).resolve().parent.parent)
    jsonschema.validate(log, _schema("sarif-2.1.0-subset.schema.json"))
    results = log["runs"][0]["results"]
    rule_ids = {r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]}
    assert all(r["ruleId"] in rule_ids for r in results)
    # every example matches its expectation: its findings are the bugs it expects
    assert results and all(r["level"] == "note" for r in results)
    for o in outcomes:
        if o.expect == "bug":
            mine = [r for r in results if r["properties"]["case"] == o.name]
            assert mine[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("examples/")
            lines = {mine[0]["locations"][0]["physicalLocation"]["region"]["startLine"]}
            lines |= {rl["physicalLocation"]["region"]["startLine"] for rl in mine[0].get("relatedLocations", [])}
            assert o.bug_line in lines


def test_junit_xml_counts_mismatches(outcomes):
    flipped = CaseOutcome("flipped", outcomes[0].file, "bug", outcomes[0].result, seconds=0.1)
    root = ET.fromstring(junit_xml(list(outcomes) + [flipped]))
    assert root.get("tests") == str(len(outcomes) + 1)
    assert root.get("failures") == "1"
    failed = [tc for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert [tc.get("name") for tc in failed] == ["flipped"]


def test_text_reports_found_bugs_as_expected_not_as_failed_verifications(outcomes):
    for o in outcomes:
        head = outcome_text(o)[0]
        if o.expect == "bug":
            assert head.startswith(f"expected  {o.name}  bug found as expected  "), head
            assert "not verified" not in head
        else:
            assert head.startswith(f"ok        {o.name}  verified  "), head
    flipped = CaseOutcome("flipped", outcomes[0].file, "bug", outcomes[0].result, seconds=0.1)
    assert outcome_text(flipped)[0].startswith("MISMATCH  flipped  verified (expected bug)")


def test_sarif_levels_notes_for_expected_bugs_errors_for_mismatches(outcomes):
    bug = next(o for o in outcomes if o.expect == "bug")
    ok = next(o for o in outcomes if o.expect == "verified")
    # the same failing result in a case that does not expect a bug is an error
    unexpected = CaseOutcome("unexpected", bug.file, "verified", bug.result, seconds=0.1)
    says_bug = CaseOutcome("says_bug", ok.file, "bug", ok.result, seconds=0.1)
    log = sarif_log([bug, unexpected, says_bug], root=Path(__file__).resolve().parent.parent)
    jsonschema.validate(log, _schema("sarif-2.1.0-subset.schema.json"))
    by_case: dict[str, set[str]] = {}
    for r in log["runs"][0]["results"]:
        case = r.get("properties", {}).get("case") or r["message"]["text"].split("]")[0][1:]
        by_case.setdefault(case, set()).add(r["level"])
    assert by_case == {bug.name: {"note"}, "unexpected": {"error"}, "says_bug": {"error"}}


def test_json_status_and_matches_expectation(outcomes):
    flipped = CaseOutcome("flipped", outcomes[0].file, "bug", outcomes[0].result, seconds=0.1)
    errored = CaseOutcome("broken", outcomes[0].file, "verified", None, error="boom")
    doc = json.loads(outcomes_json(list(outcomes) + [flipped, errored]))
    jsonschema.validate(doc, _schema("report-v1.schema.json"))
    cases = {c["name"]: c for c in doc["cases"]}
    for o in outcomes:
        c = cases[o.name]
        assert c["matches_expectation"] is True
        assert c["status"] == ("expected" if o.expect == "bug" else "ok")
    assert (cases["flipped"]["status"], cases["flipped"]["matches_expectation"]) == ("mismatch", False)
    assert (cases["broken"]["status"], cases["broken"]["matches_expectation"]) == ("error", False)


def test_json_schema_lists_every_failure_kind():
    kinds = _schema("report-v1.schema.json")["$defs"]["failure"]["properties"]["kind"]["enum"]
    assert set(kinds) == set(FAILURE_KINDS)


def test_explain_attributes_steps_to_the_family_rule_file():
    from rulekit import Tiny

    from test_rules_gather import last_token

    t = Tiny()
    xs, xd = t.input((8, 6, 4), (None, "x", None))
    is_, id_ = t.input((1,), (), dtype="int32")
    gs = t.sop("gather", [xs, is_], (1, 6, 4), **last_token((1, 6, 4)))
    gd = t.dop("gather", [xd, id_], (1, 3, 4), **last_token((1, 3, 4)))
    ys = t.sop("transpose", [gs], (4, 6, 1), permutation=(2, 1, 0))
    yd = t.dop("transpose", [gd], (4, 3, 1), permutation=(2, 1, 0))
    t.output(ys, yd, (None, "x", None))
    out = t.run()
    assert out.result.verified
    text = "\n".join(explain(out.result, "out0", 1))
    assert "by gather (gather.dl)" in text and "by transpose (layout.dl)" in text
    assert "gather (layout.dl)" not in text


def test_hlo_pair_text_shows_the_instruction_and_source_chain():
    from dlverify.ir import Frame
    from dlverify.reports.text import pair_text
    from dlverify.verdict import Failure, Result

    f = Failure("add", "/x/m.hlo", 12, "boom",
                frames=(Frame("/x/m.hlo", 12, "add.3"), Frame("/y/model.py", 40, "fwd")))
    bad = Result("p", False, ["out0: not proved"], [f], ["spec relation"])
    assert pair_text("a vs b", bad, 0.5) == [
        "NOT verified  a vs b  0.50s", "  add at m.hlo:12: boom",
        "      at instruction %add.3 (m.hlo:12); source: model.py:40 (fwd)",
        "  assumption: spec relation"]
    good = Result("p", True, ["out0 = r0.out0"], [], ["spec relation"])
    assert pair_text("a vs b", good, 0.5) == [
        "verified      a vs b  0.50s", "  out0 = r0.out0", "  assumption: spec relation"]
