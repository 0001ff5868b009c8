"""Fact validation, Soufflé .facts writing, Soufflé .csv reading, and the souffle runner
(Soufflé is not installed here: a fake `souffle` on PATH stands in for it)."""
from __future__ import annotations

import json
import shutil
import os
import sys
from pathlib import Path

import pytest

from dlverify.engine import resolve_engine, run_program
from dlverify.engine.dialect import parse_program
from dlverify.engine.facts_io import (parse_value, read_csv_text, sort_rows, tsv_text, validate_rows,
                                      write_facts_dir)
from dlverify.engine.souffle_runner import souffle_command, type_resolver
from dlverify.errors import EngineError, InputError
from dlverify.schema import Column, Relation

TYPES = {
    "OffList": ("record", ("number", "OffList")),
    "Scale": ("record", ("number", "number", "number", "number")),
    "Key": ("record", ("OffList", "OffList")),
    "Named": ("record", ("symbol", "number")),
    "TensorId": ("number", ()),
}


def resolve(ty: str):
    if ty in ("number", "symbol"):
        return ty, ()
    return TYPES[ty]


# ---------------------------------------------------------------------------- validation


class NpInt:  # an integer-like value such as numpy.int64
    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v


def test_validate_rows_converts_and_checks():
    assert validate_rows("R", ("number", "symbol"), [[1, "a"], (2, "b")]) == [(1, "a"), (2, "b")]
    assert validate_rows("R", ("number",), [(NpInt(7),)]) == [(7,)]
    assert validate_rows("R", ("number",), []) == []
    assert validate_rows("R", ("number",), [(2**31 - 1,), (-(2**31),)]) == [(2**31 - 1,), (-(2**31),)]


@pytest.mark.parametrize("kinds, rows, words", [
    (("number",), [(2**31,)], ["R", str(2**31), "32-bit"]),
    (("number",), [(0,), (-(2**31) - 1,)], ["R", str(-(2**31) - 1)]),
    (("number",), [(True,)], ["integer", "True"]),
    (("number",), [(1.0,)], ["integer", "1.0"]),
    (("number",), [("1",)], ["integer"]),
    (("symbol",), [(1,)], ["string"]),
    (("symbol",), [("a\tb",)], ["tab"]),
    (("symbol",), [("ok",), ("a\nb",)], ["newline", "'a\\nb'"]),
    (("symbol",), [("a\rb",)], ["carriage return"]),
    (("number", "number"), [(1, 2), (3,)], ["(3,)", "expected 2"]),
    (("record",), [((1, None),)], ["flat"]),
])
def test_validate_rows_refuses(kinds, rows, words):
    with pytest.raises(InputError) as e:
        validate_rows("R", kinds, rows)
    for w in words:
        assert w in str(e.value)


# ---------------------------------------------------------------------------- .facts writing


def test_tsv_is_sorted_deduplicated_and_headerless():
    assert tsv_text([(3, "b"), (1, "z z"), (3, "a"), (1, "z z"), (-5, "")]) == "-5\t\n1\tz z\n3\ta\n3\tb\n"
    assert tsv_text([]) == ""


def test_write_facts_dir_writes_every_input(tmp_path):
    write_facts_dir(tmp_path / "f", ["A", "B"], {"A": [(2,), (1,)]})
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["A.facts", "B.facts"]
    assert (tmp_path / "f" / "A.facts").read_text() == "1\n2\n"
    assert (tmp_path / "f" / "B.facts").read_text() == ""


# ---------------------------------------------------------------------------- .csv reading


@pytest.mark.parametrize("text, ty, value", [
    ("[3, [4, nil]]", "OffList", (3, (4, None))),
    ("nil", "OffList", None),
    ("[-1, nil]", "OffList", (-1, None)),
    ("[1, 0, 0, 0]", "Scale", (1, 0, 0, 0)),
    ("[-3, 2, 0, -1]", "Scale", (-3, 2, 0, -1)),
    ("[[1, nil], [2, [3, nil]]]", "Key", ((1, None), (2, (3, None)))),
    ("[nil, nil]", "Key", (None, None)),
    ("[a b, 5]", "Named", ("a b", 5)),
    ("-17", "TensorId", -17),
    ("x, y", "symbol", "x, y"),
])
def test_parse_value(text, ty, value):
    assert parse_value(text, ty, resolve) == value


@pytest.mark.parametrize("text, ty", [
    ("[3, 4]", "OffList"),       # 4 is not an OffList
    ("[1, 0, 0]", "Scale"),      # too short
    ("[1, 0, 0, 0, 0]", "Scale"),  # too long
    ("[1,0,0,0]", "Scale"),      # Soufflé separates with ", "
    ("nil x", "OffList"),
    ("abc", "number"),
])
def test_parse_value_refuses_malformed(text, ty):
    with pytest.raises(EngineError):
        parse_value(text, ty, resolve)


def test_read_csv_text():
    text = "1\tsym bol\t[1, [2, nil]]\t[1, 0, 0, 0]\n-2\t\tnil\t[0, 1, 0, 0]\n"
    rows = read_csv_text(text, ["TensorId", "symbol", "OffList", "Scale"], resolve)
    assert rows == [(1, "sym bol", (1, (2, None)), (1, 0, 0, 0)), (-2, "", None, (0, 1, 0, 0))]
    with pytest.raises(EngineError, match="expected 2"):
        read_csv_text("1\t2\t3\n", ["number", "number"], resolve)


def test_sort_rows_with_nil_inside_records():
    rows = [(2, (1, None)), (1, None), (1, (0, (5, None))), (1, (0, None))]
    assert sort_rows(rows) == [(1, None), (1, (0, None)), (1, (0, (5, None))), (2, (1, None))]
    assert sort_rows([(2, "b"), (1, "a")]) == [(1, "a"), (2, "b")]


# ---------------------------------------------------------------------------- the souffle runner

PROGRAM = """\
.type OffList = [head: number, tail: OffList]
.decl Edge(a: number, b: symbol)
.input Edge
.decl Unused(a: number)
.input Unused
.decl Out(a: number, l: OffList)
.output Out
Out(a, [a, nil]) :- Edge(a, _).
"""
EDGE = Relation("Edge", (Column("a", "number"), Column("b", "symbol")), "")
OUT = Relation("Out", (Column("a", "number"), Column("l", "OffList")), "", "output")

FAKE = """\
#!{python}
# A stand-in for `souffle -F facts -D out -I dir main.dl`: records its arguments and the
# facts it was given, then writes the outputs found in $FAKE_SOUFFLE_OUTPUTS.
import json, os, shutil, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("Souffle")
    print("Version: fake")
    sys.exit(0)
log = os.environ["FAKE_SOUFFLE_LOG"]
facts_dir, out_dir = args[args.index("-F") + 1], args[args.index("-D") + 1]
facts = {{n: open(os.path.join(facts_dir, n)).read() for n in os.listdir(facts_dir) if n.endswith(".facts")}}
json.dump({{"args": args, "facts": facts}}, open(os.path.join(log, "call.json"), "w"))
if os.environ.get("FAKE_SOUFFLE_FAIL"):
    print("Error: syntax error in main.dl", file=sys.stderr)
    sys.exit(3)
src = os.environ["FAKE_SOUFFLE_OUTPUTS"]
for n in os.listdir(src):
    shutil.copy(os.path.join(src, n), os.path.join(out_dir, n))
"""


@pytest.fixture
def fake_souffle(tmp_path, monkeypatch):
    bindir, log, outputs = tmp_path / "bin", tmp_path / "log", tmp_path / "outputs"
    for d in (bindir, log, outputs):
        d.mkdir()
    exe = bindir / "souffle"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SOUFFLE_LOG", str(log))
    monkeypatch.setenv("FAKE_SOUFFLE_OUTPUTS", str(outputs))
    monkeypatch.setenv("DLVERIFY_SOUFFLE_MODE", "interpreted")  # the fake cannot compile
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (outputs / "Out.csv").write_text("3\t[3, nil]\n1\t[1, nil]\n")
    main = tmp_path / "dl" / "main.dl"
    main.parent.mkdir()
    main.write_text(PROGRAM)
    return main, log


def test_souffle_runner_end_to_end(fake_souffle, tmp_path):
    main, log = fake_souffle
    # auto: no compiled binary of these rules is cached, so clingo is the faster engine
    assert run_program(main, {EDGE: [(1, "z")]}, [OUT], engine="auto").engine == "clingo"
    res = run_program(main, {EDGE: [(3, "x y"), (1, "z")]}, [OUT], engine="souffle")
    assert res.engine == "souffle" and res.work_dir is None
    assert res.relations == {"Out": [(1, (1, None)), (3, (3, None))]}
    call = json.loads((log / "call.json").read_text())
    args = call["args"]
    assert args[args.index("-I") + 1] == str(main.parent.resolve())
    assert args[-1] == str(main.resolve())
    assert not Path(args[args.index("-F") + 1]).exists()  # the temporary dir is removed
    assert call["facts"] == {"Edge.facts": "1\tz\n3\tx y\n", "Unused.facts": ""}
    # the same program with clingo gives the same values
    assert run_program(main, {EDGE: [(3, "x y"), (1, "z")]}, [OUT], engine="clingo").relations == res.relations


def test_souffle_runner_keep_dir(fake_souffle, tmp_path):
    main, log = fake_souffle
    keep = tmp_path / "keep"
    res = run_program(main, {EDGE: [(1, "z")]}, [OUT], engine="souffle", keep_dir=keep)
    assert res.work_dir == keep
    assert (keep / "Edge.facts").read_text() == "1\tz\n" and (keep / "Unused.facts").read_text() == ""
    assert (keep / "out" / "Out.csv").is_file()
    args = json.loads((log / "call.json").read_text())["args"]
    assert args[args.index("-F") + 1] == str(keep) and args[args.index("-D") + 1] == str(keep / "out")


def test_souffle_failure_raises_engine_error(fake_souffle, monkeypatch):
    main, _ = fake_souffle
    monkeypatch.setenv("FAKE_SOUFFLE_FAIL", "1")
    with pytest.raises(EngineError) as e:
        run_program(main, {}, [OUT], engine="souffle")
    msg = str(e.value)
    assert "exit code 3" in msg and "syntax error in main.dl" in msg and "\n" not in msg


def test_souffle_missing_output_file(fake_souffle, tmp_path):
    main, _ = fake_souffle
    (tmp_path / "outputs" / "Out.csv").unlink()
    with pytest.raises(EngineError, match="Out.csv"):
        run_program(main, {}, [OUT], engine="souffle")


def test_souffle_command_and_type_resolver(tmp_path):
    main = tmp_path / "main.dl"
    main.write_text(PROGRAM)
    assert souffle_command(main, tmp_path / "f", tmp_path / "o", threads=2) == [
        "souffle", "-w", "-j", "2", "-F", str(tmp_path / "f"), "-D", str(tmp_path / "o"), "-I", str(tmp_path),
        str(main)]
    res = type_resolver(parse_program(main))
    assert res("OffList") == ("record", ("number", "OffList"))
    assert res("number") == ("number", ())


def test_auto_uses_a_cached_binary_and_falls_back_to_clingo_when_it_fails(fake_souffle, monkeypatch):
    from dlverify.engine import load_rules, souffle_runner

    main, _ = fake_souffle
    monkeypatch.setenv(souffle_runner.MODE_ENV, "interpreted")
    assert resolve_engine("auto", main) == "clingo"  # the interpreter is never auto's choice
    monkeypatch.setenv(souffle_runner.MODE_ENV, "auto")
    program = load_rules(main).program
    exe = shutil.which("souffle")
    binary = souffle_runner.cache_root() / f"rules-{souffle_runner.program_digest(program, exe)}"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho 'cannot load a library' >&2\nexit 127\n")
    binary.chmod(0o755)
    assert resolve_engine("auto", main) == "souffle"
    res = run_program(main, {EDGE: [(1, "z")]}, [OUT], engine="auto")  # the binary fails: clingo
    assert res.engine == "clingo" and res.relations == {"Out": [(1, (1, None))]}
    with pytest.raises(EngineError, match="cannot load a library"):
        run_program(main, {EDGE: [(1, "z")]}, [OUT], engine="souffle")  # asked for: the error


def test_processes_compiling_the_same_rules_at_once_build_them_once(tmp_path, monkeypatch):
    """souffle_runner.compile_binary: the second caller waits on the lock file for the
    first one's build (the suite's background build and its workers), instead of a
    second compilation of minutes on the same cores."""
    import fcntl
    import threading

    from dlverify.engine import load_rules, souffle_runner
    from dlverify.limits import OutOfTime

    bindir, builds = tmp_path / "bin", tmp_path / "builds"
    bindir.mkdir()
    exe = bindir / "souffle"
    exe.write_text(f"#!{sys.executable}\n" + (
        "import pathlib, sys, time\n"
        "if sys.argv[1] == '--version':\n    print('fake 0'); sys.exit(0)\n"
        f"with open({str(builds)!r}, 'a') as f: f.write('build\\n')\n"
        "time.sleep(1.0)\n"
        "out = pathlib.Path(sys.argv[sys.argv.index('-o') + 1])\n"
        "out.write_text('#!/bin/sh\\n'); out.chmod(0o755)\n"))
    exe.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    main = tmp_path / "dl" / "main.dl"
    main.parent.mkdir()
    main.write_text(PROGRAM)
    program = load_rules(main).program
    got: list[Path] = []

    def build() -> None:
        got.append(souffle_runner.compile_binary(program, main, str(exe)))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] == got[1] and got[0].is_file()
    assert builds.read_text() == "build\n"            # one compilation
    assert not [p for p in got[0].parent.iterdir() if p.name.startswith("build-")]
    # a build that another process holds past this caller's time limit: out of time
    got[0].unlink()
    with open(got[0].with_suffix(".lock"), "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(OutOfTime, match="waiting for another process"):
            souffle_runner.compile_binary(program, main, str(exe), timeout=0.5)
