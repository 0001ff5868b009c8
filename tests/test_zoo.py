"""`dlverify zoo`: manifests and targets, the pool with per-item limits (a hung,
a raising, a crashing and an out-of-memory item are reported and the others
finish), the verdict cache and its invalidation, --resume after an interruption,
the aggregate reports, and the HTML page rendered by a real headless Chromium.

Items are tiny case files written here (two ranks, one elementwise op), never
the bundled examples: the whole file must stay fast."""
import json
import shutil
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import replace
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from dlverify.cli import app
from dlverify.errors import InputError
from dlverify.zoo import ZooOptions, run_zoo
from dlverify.zoo.items import CaseEntry, DumpEntry, HloEntry, ItemLimits, entries_of, read_manifest
from dlverify.zoo.outputs import write_reports

TINY = '''\
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify
{extra_import}

def _dist(local):
    mesh = dlverify.host_mesh((2,), ("x",))
    return jax.shard_map(local, mesh=mesh, in_specs=(P("x"),), out_specs=P("x"))


def _args():
    return (jax.ShapeDtypeStruct((4, 4), jnp.float32),)


@dlverify.case
def doubled():
    return dlverify.Case(seq=lambda x: x * 2.0, dist=_dist(lambda x: x * 2.0), args=_args())


@dlverify.case
def doubled_bug_wrong_scale():
    def local(x):
        return x * {factor}  # BUG: the wrong factor
    return dlverify.Case(seq=lambda x: x * 2.0, dist=_dist(local), args=_args(), expect="bug")
'''

HANGS = '''\
import dlverify


@dlverify.case
def hangs():
    while True:
        pass
'''

RAISES = '''\
import dlverify


@dlverify.case
def raises():
    raise RuntimeError("boom")  # line 6
'''

CRASHES = '''\
import os
import signal

import dlverify


@dlverify.case
def crashes():
    os.kill(os.getpid(), signal.SIGSEGV)
'''

GREEDY = '''\
import dlverify


@dlverify.case
def greedy():
    return bytearray(8 << 30)
'''


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def tiny(folder: Path, name: str = "tiny.py", factor: str = "3.0", extra_import: str = "") -> Path:
    return write(folder, name, TINY.format(factor=factor, extra_import=extra_import))


def options(tmp: Path, **kw) -> ZooOptions:
    return replace(ZooOptions(jobs=2, engine="clingo", cache_dir=tmp / "cache"), **kw)


def by_id(run) -> dict:
    return {r.id.rsplit("/", 1)[-1]: r for r in run.results}


# ---------------------------------------------------------------------------- targets

def test_manifest_entries_and_defaults(tmp_path):
    tiny(tmp_path)
    for name in ("seq.hlo", "dist.hlo", "spec.toml"):
        write(tmp_path, name, "")
    (tmp_path / "dump").mkdir()
    manifest = write(tmp_path, "zoo.toml", textwrap.dedent('''\
        [defaults]
        timeout = 30
        max_memory = "1G"

        [[cases]]
        path = "tiny.py"
        name = "doubled"
        timeout = 5

        [[hlo]]
        seq = "seq.hlo"
        dist = "dist.hlo"
        spec = "spec.toml"
        ranks = 2
        expect = "bug"

        [[dumps]]
        path = "dump"
        '''))
    case, hlo, dump = read_manifest(manifest)
    assert case == CaseEntry(tmp_path / "tiny.py", "doubled", ItemLimits(5.0, 1 << 30))
    assert isinstance(hlo, HloEntry) and hlo.spec == tmp_path / "spec.toml" and hlo.ranks == 2
    assert hlo.expect == "bug" and hlo.limits == ItemLimits(30.0, 1 << 30)
    assert hlo.label == "seq.hlo vs dist.hlo"
    assert dump == DumpEntry(tmp_path / "dump", limits=ItemLimits(30.0, 1 << 30))


@pytest.mark.parametrize("body, line, words", [
    ('[[cases]]\npath = "tiny.py"\ncolour = 1\n', 1, "unknown key 'colour'"),
    ('[[cases]]\npath = "tiny.py"\n\n[[cases]]\npath = "nope.py"\n', 4, "no such file"),
    ('[[hlo]]\nseq = "tiny.py"\ndist = "tiny.py"\nexpect = "maybe"\n', 1, "expect must be"),
    ('[[hlo]]\nseq = "tiny.py"\n', 1, "missing 'dist'"),
    ('[defaults]\ntimeout = -1\n[[cases]]\npath = "tiny.py"\n', 1, "timeout"),
    ('[[cases]]\npath = "tiny.py"\nmax_memory = "lots"\n', 1, "max_memory"),
    ('[extras]\n', 1, "unknown section 'extras'"),
    ('[[cases]\n', 1, "not valid TOML"),
    ('', 0, "lists nothing"),
])
def test_manifest_errors_name_file_and_line(tmp_path, body, line, words):
    tiny(tmp_path)
    manifest = write(tmp_path, "zoo.toml", body)
    with pytest.raises(InputError) as e:
        read_manifest(manifest)
    assert e.value.file == str(manifest) and e.value.line == line
    assert words in e.value.message


def test_folder_means_its_example_files(tmp_path):
    tiny(tmp_path, "a.py")
    (tmp_path / "sub").mkdir()
    tiny(tmp_path / "sub", "b.py")
    write(tmp_path, "_private.py", "import dlverify\n")
    write(tmp_path, "plain.py", "x = 1\n")  # no dlverify: a helper, not an example
    (tmp_path / ".hidden").mkdir()
    tiny(tmp_path / ".hidden", "c.py")
    found = entries_of([str(tmp_path)])
    assert [e.path for e in found] == [tmp_path / "a.py", tmp_path / "sub" / "b.py"]
    # a glob means every file it matches (as the shell would); PATH.py::NAME; each entry once
    found = entries_of([str(tmp_path / "[ap]*.py"), str(tmp_path / "a.py"),
                        f"{tmp_path / 'a.py'}::doubled"])
    assert found == [CaseEntry(tmp_path / "a.py"), CaseEntry(tmp_path / "plain.py"),
                     CaseEntry(tmp_path / "a.py", "doubled")]
    for bad in ([str(tmp_path / "*.nothing")], [str(tmp_path / "missing.py")], []):
        with pytest.raises(InputError):
            entries_of(bad)


# ---------------------------------------------------------------------------- the pool

@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    """Tiny real cases next to a hung, a raising, a crashing and a greedy item,
    on two jobs; the hung item has a 2 s limit, the greedy one 1G of memory."""
    tmp = tmp_path_factory.mktemp("zoo")
    entries = [CaseEntry(tiny(tmp)),
               CaseEntry(write(tmp, "hangs.py", HANGS), limits=ItemLimits(seconds=2.0)),
               CaseEntry(write(tmp, "raises.py", RAISES)),
               CaseEntry(write(tmp, "crashes.py", CRASHES)),
               CaseEntry(write(tmp, "greedy.py", GREEDY), limits=ItemLimits(memory_bytes=1 << 30))]
    return tmp, entries, run_zoo(entries, options(tmp))


def test_failing_items_are_reported_and_the_others_finish(zoo_run):
    tmp, _, run = zoo_run
    got = by_id(run)
    assert set(got) == {"tiny.py::doubled", "tiny.py::doubled_bug_wrong_scale", "hangs.py::hangs",
                        "raises.py::raises", "crashes.py::crashes", "greedy.py::greedy"}
    assert got["tiny.py::doubled"].status == "ok"
    assert got["tiny.py::doubled"].detail.outputs == ["out0 = concat(r0.out0, r1.out0; dim 0)"]
    bug = got["tiny.py::doubled_bug_wrong_scale"]
    assert bug.status == "expected" and bug.verdict == "bug"
    assert bug.detail.source_text.startswith("return x * 3.0  # BUG")
    assert bug.detail.svg.startswith("<svg") and "failing" in bug.detail.svg
    assert got["hangs.py::hangs"].error_kind == "out_of_time"
    assert "out of time after 2 s" in got["hangs.py::hangs"].error
    raised = got["raises.py::raises"]
    assert raised.error_kind == "input_error"
    assert raised.error.startswith(f"{tmp / 'raises.py'}:6: case raises failed to build: "
                                   "RuntimeError: boom")
    assert got["crashes.py::crashes"].error_kind == "crashed"
    assert "SIGSEGV" in got["crashes.py::crashes"].error
    assert got["greedy.py::greedy"].error_kind == "out_of_memory"
    assert run.code == 3  # a limit was hit: 3 over 2 (bad input, crash)
    assert run.summary().startswith(
        "summary: 6 items: 1 verified, 1 bug found as expected, 0 mismatches, 4 errors "
        "(1 out of time, 1 out of memory, 1 crashed, 1 bad input)")
    # the results are in the order of the entries, not of completion
    assert [r.id.rsplit("/", 1)[-1] for r in run.results][:3] == [
        "tiny.py::doubled", "tiny.py::doubled_bug_wrong_scale", "hangs.py::hangs"]


def test_second_run_is_served_from_the_cache(zoo_run):
    tmp, entries, first = zoo_run
    again = run_zoo([entries[0]], options(tmp))
    assert again.from_cache == 2 and all(r.cached for r in again.results)
    assert [(r.id, r.status) for r in again.results] == [(r.id, r.status) for r in first.results[:2]]
    fresh = run_zoo([entries[0]], options(tmp, use_cache=False))
    assert fresh.from_cache == 0 and not any(r.cached for r in fresh.results)
    # errors are not cached: the raising item runs again
    raised = run_zoo([entries[2]], options(tmp))
    assert raised.from_cache == 0 and raised.results[0].error_kind == "input_error"


def test_manifest_of_hlo_pairs_and_a_dump_folder(tmp_path):
    data = Path(__file__).resolve().parent / "data"
    manifest = write(tmp_path, "zoo.toml", textwrap.dedent(f'''\
        [[hlo]]
        seq = "{data}/mutants/jax_flatten_seq.hlo"
        dist = "{data}/mutants/jax_flatten_dist.hlo"

        [[hlo]]
        seq = "{data}/mutants/jax_flatten_seq.hlo"
        dist = "{data}/mutants/jax_flatten_wrong_gather_dim.hlo"
        expect = "bug"

        [[dumps]]
        path = "{data}/hostile/dumps/good"
        '''))
    run = run_zoo(entries_of([str(manifest)]), options(tmp_path))
    assert [(r.kind, r.status) for r in run.results] == [
        ("hlo", "ok"), ("hlo", "expected"), ("dump", "ok"), ("dump", "ok")]
    assert run.results[0].id == "jax_flatten_seq.hlo vs jax_flatten_dist.hlo"
    assert run.results[0].detail.assumptions  # the relation taken from the sharding annotation
    bug = run.results[1].detail
    assert bug.first_failure.startswith("all_gather at jax_flatten_wrong_gather_dim.hlo:25")
    assert bug.svg.startswith("<svg")
    assert run.results[2].id.startswith(f"{data}/hostile/dumps/good::module_0001.jit_f")
    assert run.code == 0
    assert run_zoo(entries_of([str(manifest)]), options(tmp_path)).from_cache == 4


def test_cache_misses_when_the_file_or_a_helper_module_changes(tmp_path):
    write(tmp_path, "zoo_helper_mod.py", "FACTOR = 2.0\n")
    path = tiny(tmp_path, extra_import="from zoo_helper_mod import FACTOR  # noqa: F401")
    entry = CaseEntry(path, "doubled")
    assert run_zoo([entry], options(tmp_path)).from_cache == 0
    assert run_zoo([entry], options(tmp_path)).from_cache == 1
    write(tmp_path, "zoo_helper_mod.py", "FACTOR = 2.0  # changed\n")
    assert run_zoo([entry], options(tmp_path)).from_cache == 0
    tiny(tmp_path, factor="4.0", extra_import="from zoo_helper_mod import FACTOR  # noqa: F401")
    assert run_zoo([entry], options(tmp_path)).from_cache == 0
    assert run_zoo([entry], options(tmp_path)).from_cache == 1


class _StopAfterFirst:
    """A display that interrupts the run (as Ctrl-C would) once one item is done."""

    def add_total(self, n):
        pass

    def started(self, item_id):
        pass

    def event(self, item_id, event):
        pass

    def finished(self, item_id, results):
        raise KeyboardInterrupt


def test_resume_keeps_the_items_an_interrupted_run_finished(tmp_path):
    entries = [CaseEntry(write(tmp_path, "raises.py", RAISES), "raises"),
               CaseEntry(tiny(tmp_path), "doubled")]
    opts = options(tmp_path, jobs=1, use_cache=False)  # one job: the items run in order
    with pytest.raises(KeyboardInterrupt):
        run_zoo(entries, opts, _StopAfterFirst())
    resumed = run_zoo(entries, replace(opts, resume=True))
    assert resumed.resumed == 1 and resumed.results[0].cached  # the error is kept too
    assert resumed.results[0].error_kind == "input_error"
    assert resumed.results[1].status == "ok" and not resumed.results[1].cached
    # everything finished now: a resumed run keeps it all
    assert run_zoo(entries, replace(opts, resume=True)).resumed == 2
    # a run without --resume starts afresh
    assert run_zoo(entries, opts).resumed == 0


# ---------------------------------------------------------------------------- reports

def test_reports_json_junit_sarif(zoo_run, tmp_path):
    _, _, run = zoo_run
    page = write_reports(run, tmp_path / "report")
    assert page == tmp_path / "report" / "index.html"
    doc = json.loads((tmp_path / "report" / "zoo.json").read_text())
    schema = json.loads(resources.files("dlverify").joinpath(
        "schemas", "report-v1.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert [c["status"] for c in doc["cases"]] == [r.status for r in run.results]
    suite = ET.fromstring((tmp_path / "report" / "junit.xml").read_text())
    assert suite.get("tests") == "6" and suite.get("errors") == "4"
    sarif = json.loads((tmp_path / "report" / "zoo.sarif").read_text())
    levels = {r["level"] for r in sarif["runs"][0]["results"]}
    assert levels == {"note"}  # the one finding is the bug its case expects


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="no chromium (Debian: apt-get install chromium; "
                                                ".ci/run installs it)")
def test_html_report_renders_in_headless_chromium(zoo_run, tmp_path):
    _, _, run = zoo_run
    page = write_reports(run, tmp_path / "report")
    dom = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    import html.parser

    class Rows(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.buttons, self.svgs, self.counts = [], [], 0, None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "tr" and "item" in (a.get("class") or "").split():
                self.rows.append((a["data-id"].rsplit("/", 1)[-1], a["data-status"],
                                  a["data-verdict"]))
            elif tag == "button":
                self.buttons.append(a.get("data-status"))
            elif tag == "svg":
                self.svgs += 1
            elif a.get("id") == "rendered-counts":
                self.counts = a.get("data-items")

    parsed = Rows()
    parsed.feed(dom)
    assert parsed.rows == [(r.id.rsplit("/", 1)[-1], r.status, r.verdict) for r in run.results]
    assert ("tiny.py::doubled_bug_wrong_scale", "expected", "bug") in parsed.rows
    # written by the page's script: it ran in the browser
    assert parsed.counts == "6"
    assert parsed.buttons == ["all", "ok", "expected", "mismatch", "error"]
    assert "6 items: 1 verified, 1 bugs found as expected, 0 mismatches, 4 errors" in dom
    assert parsed.svgs == 1 and "return x * 3.0  # BUG" in dom


# ---------------------------------------------------------------------------- the command

def test_cli_zoo_summary_reports_and_exit_codes(tmp_path):
    path = tiny(tmp_path)
    args = ["zoo", str(path), "--jobs", "2", "--engine", "clingo", "--cache-dir",
            str(tmp_path / "cache"), "--report-dir", str(tmp_path / "out")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()  # one line per item as it finishes, then the summary
    assert sorted(line.split()[0] for line in lines[:-1]) == ["expected", "ok"]
    assert any(line.startswith("ok        ") and "tiny.py::doubled  verified" in line
               for line in lines[:-1])
    assert lines[-1].startswith("summary: 2 items: 1 verified, 1 bug found as expected, "
                                "0 mismatches, 0 errors")
    assert lines[-1].endswith(f"report: {tmp_path / 'out' / 'index.html'}")
    assert (tmp_path / "out" / "index.html").is_file()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "2 from the cache" in again.stdout
    assert all(line.endswith("(cached)") for line in again.stdout.splitlines()[:-1])
    # a verdict that differs from its expectation: 1
    tiny(tmp_path, factor="2.0")
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and "MISMATCH" in res.stdout


@pytest.mark.parametrize("args, words", [
    (["zoo", "missing.py"], "missing.py: no such file"),
    (["zoo", "x.py", "--jobs", "0"], "--jobs 0"),
    (["zoo", "x.py", "--max-memory", "lots"], "--max-memory"),
    (["zoo", "x.py", "--engine", "fast"], "unknown engine"),
])
def test_cli_zoo_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    tiny(tmp_path, "x.py")
    res = CliRunner().invoke(app, [*args, "--cache-dir", str(tmp_path / "c")])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and words in res.output
