"""Property-based fuzzing (hypothesis) of the three kinds of input a user
writes: HLO text, relation-spec TOML and case files. The property: a verdict,
or a one-line input error naming the file (and the line, where the input has
one); never a traceback, never an internal error.

HLO and specs are checked at the library boundary (fast: parsing and pairing
raise InputError or build a Problem); case files through the CLI, where the
case runs in a supervised child. Bounded and derandomized: the same examples
every run, no example database."""
import textwrap
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlverify.cli import app
from dlverify.errors import InputError
from dlverify.ir import IdAllocator

HOSTILE = Path(__file__).resolve().parent / "data" / "hostile"
SEQ_TEXT = (HOSTILE / "specs" / "seq.hlo").read_text()
DIST_TEXT = (HOSTILE / "specs" / "dist.hlo").read_text()

FAST = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=8)

HLO_TOKENS = ["f32", "s32", "bf16", "pred", "[", "]", "{", "}", "(", ")", ",", "=", "%", "\n",
              "parameter(0)", "parameter(1)", "ROOT", "ENTRY", "tanh", "add", "dot", "reshape",
              "tuple", "get-tuple-element", "sharding={replicated}",
              "sharding={devices=[2,1]<=[2]}", "num_partitions=2", "num_partitions=0",
              "num_partitions=99999999999", "f32[4,4]{1,0}", "f32[2147483648]", "f32[-1]",
              "x", "t", "HloModule", "lhs_contracting_dims={1}", "0", "1", "-1", "1e999", " "]


@st.composite
def mutated(draw, text: str) -> str:
    """The text with a few token insertions, deletions or cuts."""
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "cut", "repeat"]))
        if action == "insert":
            text = text[:where] + draw(st.sampled_from(HLO_TOKENS)) + text[where:]
        elif action == "delete":
            text = text[:where] + text[where + draw(st.integers(1, 12)):]
        elif action == "cut":
            text = text[:where]
        else:
            line_start = text.rfind("\n", 0, where) + 1
            line_end = text.find("\n", where)
            line = text[line_start:line_end if line_end >= 0 else len(text)]
            text = text[:line_start] + line + "\n" + text[line_start:]
    return text


def _problem_or_input_error(seq: Path, dist: Path, spec_path: Path | None = None) -> None:
    """Builds the Problem; InputError must name the file it is about."""
    from dlverify.hlo_api import hlo_problem
    from dlverify.spec import load_spec

    try:
        spec = load_spec(spec_path) if spec_path is not None else None
        hlo_problem(seq, dist, spec, None, IdAllocator())
    except InputError as e:
        assert e.file, f"no file named: {e}"
        assert Path(e.file).name in {seq.name, dist.name} | ({spec_path.name} if spec_path else set()), e
        # the line, when the error is about a line of a non-empty text
        text = Path(e.file).read_text(errors="replace")
        if e.line:
            assert 1 <= e.line <= text.count("\n") + 1, (e.line, e)


@FAST
@given(seq=mutated(SEQ_TEXT), dist=mutated(DIST_TEXT))
def test_mutated_hlo_is_a_problem_or_an_input_error(tmp_path_factory, seq, dist):
    d = tmp_path_factory.mktemp("hlo")
    (d / "seq.hlo").write_text(seq)
    (d / "dist.hlo").write_text(dist)
    _problem_or_input_error(d / "seq.hlo", d / "dist.hlo")


TOML_SCALARS = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True), st.booleans(),
                         st.text(max_size=8), st.just("replicated"))
PARAM_VALUES = st.one_of(
    TOML_SCALARS,
    st.fixed_dictionaries({"split": st.integers(-3, 5)},
                          optional={"segments": st.lists(st.integers(-2, 10), max_size=4)}),
    st.dictionaries(st.sampled_from(["split", "concat", "segments", "x"]), TOML_SCALARS,
                    max_size=3))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v == float("inf") else
                                     "-inf" if v == float("-inf") else repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"


@FAST
@given(ranks=st.one_of(st.none(), TOML_SCALARS),
       params=st.dictionaries(st.sampled_from(["0", "1", "-1", "99", "x"]), PARAM_VALUES,
                              max_size=3),
       outputs=st.dictionaries(st.sampled_from(["0", "1", "x"]), PARAM_VALUES, max_size=2))
def test_generated_specs_are_a_problem_or_an_input_error(tmp_path_factory, ranks, params, outputs):
    d = tmp_path_factory.mktemp("spec")
    (d / "seq.hlo").write_text(SEQ_TEXT)
    (d / "dist.hlo").write_text(DIST_TEXT)
    lines = [] if ranks is None else [f"ranks = {_toml_value(ranks)}"]
    for table, entries in (("params", params), ("outputs", outputs)):
        if entries:
            lines.append(f"[{table}]")
            lines += [f'"{k}" = {_toml_value(v)}' for k, v in entries.items()]
    (d / "spec.toml").write_text("\n".join(lines) + "\n")
    _problem_or_input_error(d / "seq.hlo", d / "dist.hlo", d / "spec.toml")


CASE_HEADER = (HOSTILE / "cases" / "tiny.py").read_text().split("@dlverify.case")[0]
ARGS = ["(arg(8, 4),)", "(arg(5, 4),)", "(arg(2**31, 4),)", "('x',)", "arg(8, 4)", "()",
        "(arg(8, 4), arg(8, 4))", "(np.zeros((8, 4), np.float32),)", "None"]
FUNCTIONS = ["jnp.tanh", "ident", "sm(jnp.tanh)", "sm(ident)", "sm(lambda x: x * 2.0)",
             "sm(jnp.tanh, in_specs=(P('y'),))", "42", "sm(jnp.tanh, n=16)"]
STATEMENTS = ["pass", "import sys; sys.exit(0)", "raise KeyboardInterrupt",
              "raise ValueError('x')", "print('noise')"]


@SLOW
@given(args=st.sampled_from(ARGS), seq=st.sampled_from(FUNCTIONS),
       dist=st.sampled_from(FUNCTIONS), statement=st.sampled_from(STATEMENTS),
       expect=st.sampled_from(["'verified'", "'bug'", "'maybe'", "None"]))
def test_generated_case_files_end_in_a_verdict_or_one_error_line(tmp_path_factory, args, seq,
                                                                  dist, statement, expect):
    path = tmp_path_factory.mktemp("case") / "case.py"
    path.write_text(CASE_HEADER + textwrap.dedent(f"""
        @dlverify.case
        def fuzzed():
            {statement}
            return dlverify.Case(seq={seq}, dist={dist}, args={args}, expect={expect})
    """))
    res = CliRunner().invoke(app, ["check-jax", str(path)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    assert res.exit_code in (0, 1, 2, 3), res.output
    if res.exit_code == 2:
        errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and str(path) in errors[0], res.stderr
