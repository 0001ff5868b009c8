"""Bug-pattern queries (dlverify/patterns/, datalog/patterns.dl): regexes compiled to
minimal DFAs and exported as facts, the product with the distributed graph on tiny
program pairs (a match, and none once the reduction is there), the same matches
with clingo and Soufflé, the shipped patterns over examples/ (each matches a buggy
example at its bug and no correct example), --patterns on the CLI, bad files."""
import json
import shutil
from pathlib import Path

import pytest
from conftest import bug_line, example_targets, representative_targets
from rulekit import Tiny
from typer.testing import CliRunner

from dlverify import schema as S
from dlverify.cli import app
from dlverify.engine import run_program, souffle_runner
from dlverify.errors import InputError
from dlverify.ir import Mesh, Op
from dlverify.patterns import (
    ALPHABET,
    VIEW_LABELS,
    compile_pattern,
    load_patterns,
    run_patterns,
)
from dlverify.patterns.alphabet import KIND_LABELS
from dlverify.patterns.query import (
    OUTPUTS,
    pair_matches,
    pattern_facts,
    patterns_path,
    region,
)
from dlverify.patterns.spec import shipped_patterns

ROOT = Path(__file__).resolve().parent.parent
DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())
NO_REDUCTION = compile_pattern("no-reduction", "partial (!reducing_collective)* elementwise_nonlinear",
                               "a partial sum reaches a nonlinear op with no reduction in between")


# ---------------------------------------------------------------- regex -> DFA -> facts

def test_regex_compiles_to_a_minimal_dfa_exported_as_facts():
    p = NO_REDUCTION
    # start --partial--> a; a --!reducing_collective--> a; a --elementwise_nonlinear--> final
    assert p.start == 0 and len(p.finals) == 1 and len(p.transitions) == 3
    states = {t.source for t in p.transitions} | {t.target for t in p.transitions}
    assert len(states) == 3, "not minimal: (a|a)* and friends must not add states"
    facts = pattern_facts([p])
    assert facts[S.PATTERN_START] == [("no-reduction", 0)]
    assert facts[S.PATTERN_FINAL] == [("no-reduction", p.finals[0])]
    moves = {(q, a, q2) for _, q, a, q2 in facts[S.PATTERN_MOVE]}
    mid = next(q2 for q, a, q2 in moves if q == 0)
    assert moves == {(0, "partial", mid), (mid, "!reducing_collective", mid),
                     (mid, "elementwise_nonlinear", p.finals[0])}
    assert set(facts[S.LETTER_HAS]) == {("partial", "partial"),
                                        ("elementwise_nonlinear", "elementwise_nonlinear")}
    assert facts[S.LETTER_LACKS] == [("!reducing_collective", "reducing_collective")]
    # the same language written another way compiles to the same automaton
    same = compile_pattern("same", "partial (!reducing_collective | !reducing_collective)* "
                                   "elementwise_nonlinear", "e")
    assert same.transitions == p.transitions and same.finals == p.finals


def test_conjunctions_and_alphabet_from_the_op_table():
    p = compile_pattern("x", "partial&!output elementwise_linear&unrelated", "e")
    tests = dict(p.letters)
    assert [(t.label, t.negated) for t in tests["partial&!output"]] == [("partial", False),
                                                                        ("output", True)]
    assert {"exp", "all_reduce", "collective", "nonlinear", "reduction", "elementwise_linear",
            "reducing_collective", "data_movement", "output", "output_scaled", "any"} <= ALPHABET
    assert set(VIEW_LABELS) <= ALPHABET
    assert "elementwise_nonlinear" in KIND_LABELS["tanh"] and "linear" in KIND_LABELS["add"]
    assert "reducing_collective" not in KIND_LABELS["all_gather"]


@pytest.mark.parametrize("regex", ["(mul | add)* mul (mul | add) (mul | add)", "mul exp* | tanh",
                                   "(partial any*) | (scaled scaled*) output"])
def test_the_bounded_subset_construction_gives_pyformlang_s_minimal_dfa(regex):
    from pyformlang.regular_expression import Regex

    mine = compile_pattern("x", regex, "e")
    ref = Regex(regex).to_epsilon_nfa().minimize()  # unbounded: fine on these
    assert len(mine.transitions) == ref.get_number_transitions()
    assert len({t.source for t in mine.transitions} | {t.target for t in mine.transitions}) == \
        len(ref.states)


@pytest.mark.parametrize("regex,message", [
    ("partial frobnicate", "unknown label 'frobnicate'"),
    ("(partial", "malformed regex"),
    ("partial*", "matches the empty path"),
    ("", "empty regex"),
    ("$ | tanh", "matches the empty path"),
    # 2^k states after determinisation: refused at once, not minutes later
    ("(mul | add)* mul " + " ".join(["(mul | add)"] * 16), "grows beyond 2000 states"),
])
def test_bad_regexes_are_refused(regex, message):
    with pytest.raises(ValueError, match=message):
        compile_pattern("x", regex, "e")


def test_bad_files_name_the_file_and_line(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[[pattern]]\nname = "x"\nexplanation = "e"\nregex = "partial nope"\n')
    with pytest.raises(InputError) as e:
        load_patterns(f)
    assert (e.value.file, e.value.line) == (str(f), 4) and "unknown label 'nope'" in str(e.value)
    f.write_text('[[pattern]]\nname = "x"\nregex = "mul"\n')
    with pytest.raises(InputError, match="missing key 'explanation'"):
        load_patterns(f)
    two = '[[pattern]]\nname = "a"\nregex = "mul"\nexplanation = "e"\n\n'
    f.write_text(two + two.replace('"a"', '"b"').replace("regex", "severity = 1\nregex"))
    with pytest.raises(InputError) as e:
        load_patterns(f)
    assert e.value.line == 8 and "pattern 2: unknown key 'severity'" in str(e.value)
    f.write_text(two + two.replace('"mul"', '"(mul"'))
    with pytest.raises(InputError) as e:
        load_patterns(f)
    assert e.value.line == 8 and "malformed regex" in str(e.value)
    f.write_text(two + two)
    with pytest.raises(InputError) as e:
        load_patterns(f)
    assert e.value.line == 7 and "pattern a is defined twice" in str(e.value)


def test_generated_pattern_schema_is_fresh():
    on_disk = (ROOT / "datalog" / "pattern_schema.dl").read_text()
    assert on_disk == S.render_pattern_decls(), "stale: run `python -m dlverify.schema`"
    assert not {r.name for r in S.PATTERN_RELATIONS} & {r.name for r in S.RELATIONS}


# ---------------------------------------------------------------- the product on tiny graphs

def _partial_then_tanh(reduce: bool):
    """seq tanh(x @ w); dist: x's columns and w's rows split over 2 ranks, so x @ w is a
    partial sum on each rank; with `reduce`, an all_reduce completes it before the tanh."""
    t = Tiny(mesh=Mesh(("x",), (2,)))
    xs, xd = t.input((4, 8), (None, "x"))
    ws, wd = t.input((8, 5), ("x", None))
    ys = t.sop("dot_general", [xs, ws], (4, 5), **DOT)
    yd = t.dop("dot_general", [xd, wd], (4, 5), **DOT)
    if reduce:
        yd = t.dop("all_reduce", [yd], (4, 5), reducer="sum", groups=[[0, 1]])
    yd = t.dop("neg", [yd], (4, 5))   # linear: a partial sum stays partial
    t.output(t.sop("tanh", [t.sop("neg", [ys], (4, 5))], (4, 5)), t.dop("tanh", [yd], (4, 5)))
    return t.run()


def test_a_partial_sum_reaching_a_nonlinear_op_matches():
    out = _partial_then_tanh(reduce=False)
    assert not out.result.verified
    (m,) = run_patterns([NO_REDUCTION], out.problem, out.result.views, out.problem.dist.ops)
    assert (m.pattern, m.start_op, m.end_op) == ("no-reduction", "dot_general", "tanh")
    # the verdict's own explanations: the shipped pattern, on the failing outputs' ancestors
    assert [(x.pattern, x.start_op, x.end_op) for x in out.result.patterns] == [
        ("partial-into-nonlinear", "dot_general", "tanh")]


def test_no_match_once_the_reduction_is_in_between():
    out = _partial_then_tanh(reduce=True)
    assert out.result.verified and out.result.patterns == []
    assert "patterns" not in out.result.timings, "a verified run evaluates no pattern"
    assert run_patterns([NO_REDUCTION], out.problem, out.result.views, out.problem.dist.ops) == []


def test_a_failing_pattern_engine_leaves_the_verdict_and_says_so(monkeypatch):
    import dlverify.patterns.query as query
    from dlverify.errors import EngineError

    def broken(*args, **kw):
        raise EngineError("the engine broke")

    monkeypatch.setattr(query, "run_program", broken)
    out = _partial_then_tanh(reduce=False)
    assert not out.result.verified and out.result.failures and out.result.patterns == []
    assert any("bug patterns not evaluated: the engine broke" in n for n in out.result.notes)


def _chain_facts(labels: dict[int, set[str]], edges: list[tuple[int, int]]):
    return {S.PATGRAPH_OP: [(o,) for o in labels], S.PATGRAPH_EDGE: edges,
            S.PATGRAPH_LABEL: [(o, lab) for o, ls in labels.items() for lab in sorted(ls | {"any"})]}


def _product(pattern, labels, edges, engine="clingo"):
    facts = _chain_facts(labels, edges) | pattern_facts([pattern])
    for rel in S.PATTERN_RELATIONS:
        if rel.role == "input":
            facts.setdefault(rel, [])
    res = run_program(patterns_path(), facts, OUTPUTS, engine=engine)
    ops = [Op(o, "add", [], 100 + o) for o in sorted(labels)]
    return res.relations, pair_matches([pattern], ops, res.relations)


# 1 -> 2 -> 3 -> 4 and 1 -> 5 -> 4: two paths from the partial op 1 to the tanh op 4,
# one through an all_reduce (5)
LABELS = {1: {"partial"}, 2: {"partial"}, 3: {"partial"}, 4: {"elementwise_nonlinear"},
          5: {"reducing_collective"}, 6: {"partial"}}
EDGES = [(1, 2), (2, 3), (3, 4), (1, 5), (5, 4), (6, 5)]


def test_the_product_finds_the_earliest_start_and_skips_paths_through_a_reduction():
    rows, matches = _product(NO_REDUCTION, LABELS, EDGES)
    assert [(m.start_line, m.end_line) for m in matches] == [(0, 0)]  # ops without source
    ends = {o for _, o, _ in rows[S.PATTERN_ACCEPT.name]}
    assert ends == {4}
    firsts = {o for _, o, _ in rows[S.PATTERN_FIRST.name]}
    assert firsts == {1, 2, 3}, "6 reaches 4 only through the all_reduce"
    steps = {(o, o2) for _, o, _, o2, _ in rows[S.PATTERN_STEP.name]}
    assert steps == {(1, 2), (2, 3), (3, 4)}


@pytest.mark.skipif(shutil.which("souffle") is None, reason="`souffle` is not on PATH")
def test_same_product_on_clingo_and_souffle(monkeypatch):
    monkeypatch.setenv(souffle_runner.MODE_ENV, "interpreted")  # no compile in a test
    pattern = compile_pattern("p", "partial (partial | !reducing_collective&!partial)* "
                                   "elementwise_nonlinear", "e")
    a, _ = _product(pattern, LABELS, EDGES, "clingo")
    b, _ = _product(pattern, LABELS, EDGES, "souffle")
    assert a == b and a[S.PATTERN_ACCEPT.name]
    out = _partial_then_tanh(reduce=False)
    got = [run_patterns(shipped_patterns(), out.problem, out.result.views, out.problem.dist.ops, e)
           for e in ("clingo", "souffle")]
    assert got[0] == got[1] and got[0]


# ---------------------------------------------------------------- shipped patterns over examples/

EX = ROOT / "examples"
# each shipped pattern and a buggy example it explains at its `# BUG` line
EXPLAINS = {
    "partial-reaches-output": (EX / "attention_heads.py", "attention_heads_bug_missing_psum"),
    "partial-into-nonlinear": (EX / "megatron_mlp.py", "megatron_mlp_bug_gelu_on_partial_sum"),
    "partial-plus-complete": (EX / "megatron_mlp.py", "megatron_mlp_bug_bias_before_psum"),
    "partial-times-partial": (EX / "bugs" / "pytorch159856_norm_of_partial.py",
                              "pytorch159856_norm_of_partial_bug"),
    "reduction-over-wrong-group": (EX / "mesh_2d.py", "mesh_2d_bug_psum_wrong_axis"),
    "scaled-output": (EX / "data_parallel_grad.py", "dp_grad_bug_psum_no_divide"),
}
# every correct case, and the models' TP=2 sequence-parallel ones (forward and training: the
# others repeat their graphs; all are verified once per session by the suite already)
CORRECT = [(p, n) for p, n in example_targets() if p.parent.name != "models" and "bug" not in n] + \
    [(p, n) for p, n in representative_targets() if p.parent.name == "models"]


def test_every_shipped_pattern_is_documented_and_explains_an_example():
    assert {p.name for p in shipped_patterns()} == set(EXPLAINS)
    readme = (ROOT / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in EXPLAINS)


@pytest.mark.parametrize("name", sorted(EXPLAINS))
def test_shipped_pattern_matches_its_buggy_example_at_the_bug(name, example_runs):
    path, case = EXPLAINS[name]
    run = example_runs.run(path, case)
    line = bug_line(run.case.dist)
    mine = [m for m in run.result.patterns if m.pattern == name]
    assert any(line in (m.start_line, m.end_line) and str(path) in (m.start_file, m.end_file)
               for m in mine), (line, run.result.patterns)


@pytest.mark.parametrize("path,name", CORRECT, ids=[n for _, n in CORRECT])
def test_no_shipped_pattern_matches_a_correct_example(path, name, example_runs):
    """Over all the ops the outputs depend on: the most a failure's search covers (a
    verified run evaluates none)."""
    res = example_runs.run(path, name).result
    if res.problem is None or not res.verified:
        pytest.skip(f"{name} is not verified here: its own test reports that")
    if res.problem.scans:  # verified by induction (one body): search the unrolled programs
        from dlverify.api import verify_problem
        from dlverify.frontends.jaxpr import import_jax

        c = example_runs.case(path, name)
        res = verify_problem(import_jax(c.seq, c.dist, c.args, name, induction=False),
                             engine="clingo")
        assert res.verified
    ops = region(res.problem, res.problem.dist.outputs)
    assert ops and run_patterns(shipped_patterns(), res.problem, res.views, ops) == []


# ---------------------------------------------------------------- the CLI

def test_cli_patterns_option_reports_matches_in_text_json_and_sarif(tmp_path):
    mine = tmp_path / "mine.toml"
    mine.write_text('[[pattern]]\nname = "contraction-into-add"\nregex = "dot_general add&frontier"\n'
                    'explanation = "a contraction feeds an add that relates to nothing"\n'
                    'advice = "move the add"\n')
    target = f"{EX / 'megatron_mlp.py'}::megatron_mlp_bug_bias_before_psum"
    sarif = tmp_path / "out.sarif"
    runner = CliRunner()
    res = runner.invoke(app, ["check-jax", target, "--patterns", str(mine), "--json",
                                "--sarif", str(sarif)])
    assert res.exit_code == 0, res.output
    (case,) = json.loads(res.stdout)["cases"]
    got = {(m["pattern"], m["start_op"], m["end_op"], m["end_line"]) for m in case["result"]["patterns"]}
    assert ("contraction-into-add", "dot_general", "add", 96) in got
    assert ("partial-plus-complete", "dot_general", "add", 96) in got
    results = json.loads(sarif.read_text())["runs"][0]["results"]
    notes = [r for r in results if r["ruleId"] == "pattern/contraction-into-add"]
    assert notes and notes[0]["level"] == "note"
    assert notes[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 96
    text = runner.invoke(app, ["check-jax", target, "--patterns", str(mine)])
    assert text.exit_code == 0
    assert ("pattern contraction-into-add: a contraction feeds an add that relates to nothing "
            "(dot_general at megatron_mlp.py:96 -> add at megatron_mlp.py:96)") in text.stdout


def test_zoo_patterns_option_reaches_zoo_json_and_keys_the_cache(tmp_path):
    from dlverify.zoo.runner import NoDisplay, ZooOptions, _Runner

    mine = tmp_path / "mine.toml"
    mine.write_text('[[pattern]]\nname = "into-add"\nregex = "dot_general add&frontier"\n'
                    'explanation = "a contraction feeds an add"\n')
    target = f"{EX / 'megatron_mlp.py'}::megatron_mlp_bug_bias_before_psum"
    args = ["zoo", target, "--engine", "clingo", "--patterns", str(mine), "--cache-dir",
            str(tmp_path / "cache"), "--report-dir", str(tmp_path / "out")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (case,) = json.loads((tmp_path / "out" / "zoo.json").read_text())["cases"]
    assert {(m["pattern"], m["explanation"]) for m in case["result"]["patterns"]} >= {
        ("into-add", "a contraction feeds an add"), ("partial-plus-complete", EXPLAINED)}
    bad = CliRunner().invoke(app, [*args[:4], "--patterns", str(tmp_path / "missing.toml")])
    assert bad.exit_code == 2 and "--patterns: no such file" in bad.output
    # the explanations are part of a cached verdict: other patterns, another key
    salts = {_Runner([], ZooOptions(cache_dir=tmp_path / "c", patterns=ps), NoDisplay()).salt
             for ps in (None, tuple(load_patterns(mine)), (NO_REDUCTION,))}
    assert len(salts) == 3


EXPLAINED = next(p.explanation for p in shipped_patterns() if p.name == "partial-plus-complete")
