"""The bundled examples as XLA compiles them: every case of examples/*.py (the
shard_map and jit programs, correct ones and buggy twins) is lowered with JAX,
its distributed program compiled by XLA (the per-device module after
optimisations, as `--xla_dump_to` writes it in `*.after_optimizations.txt`,
with large constants printed unless `--elide-constants`; or, with `--dist spmd`,
the module right after the SPMD partitioning pass, as
`--xla_dump_hlo_pass_re=spmd-partitioning` writes it), its
sequential program taken before or after optimisations (`--seq`), and the pair
verified as HLO with no spec (`dlverify check SEQ DIST`). A correct case that is
not verified is a false alarm of dlverify on toolchain output; a buggy twin that
verifies would be unsound (never seen: reported loudly).

    python bench/xla_examples.py                      # every example file
    python bench/xla_examples.py examples/ring_attention.py --seq after --json
    python bench/xla_examples.py --keep /tmp/pairs     # keep the HLO pairs
    python bench/xla_examples.py --dist spmd           # the partitioner's output

Prints one line per case (expected verdict, verdict, for a buggy twin whether
its `# BUG` line is among the first failure's frames, compile and verify wall
seconds, the first failure) and a summary; `--json` prints the same as JSON. A
report that names an unknown value (an elided constant with no twin in the other
module) counts as such: the user learns which constant to dump.
Peak memory is the process's maximum resident set size after all cases.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

from dlverify.cases import load_cases  # noqa: E402
from dlverify.errors import InputError  # noqa: E402
from dlverify.frontends.jax_compiled import dumped_after_optimizations, dumped_after_spmd  # noqa: E402
from dlverify.hlo_api import verify_hlo  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    file: str
    case: str
    expect: str
    verdict: str            # verified | not verified | error
    compile_s: float
    verify_s: float
    first_failure: str
    located: bool | None      # a buggy twin: its `# BUG` line among the first failure's frames
    unknowns: int = 0         # values the report names as unknown (elided constants without a twin)


def _cases(path: Path):
    """The file's cases, loaded as `dlverify check-jax` loads them (an example may import
    its neighbours: pipeline_buffer.py reads pipeline_gpipe.py)."""
    for name, fn in load_cases(path):
        yield name, fn()


def _bug_line(dist_fn) -> int | None:
    """The line marked `# BUG` in the local function of a buggy twin (tests/conftest.py)."""
    fn = dist_fn
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    marked = [start + i for i, line in enumerate(lines) if "# BUG" in line]
    return marked[0] if len(marked) == 1 else None


def _texts(case, seq_stage: str, dist_stage: str, large_constants: bool) -> tuple[str, str]:
    dist = case.dist if hasattr(case.dist, "lower") else jax.jit(case.dist)
    seq = jax.jit(case.seq).lower(*case.args)
    seq_text = (dumped_after_optimizations(seq, large_constants) if seq_stage == "after"
                else seq.as_text(dialect="hlo"))
    lowered = dist.lower(*case.args)
    return seq_text, (dumped_after_spmd(lowered) if dist_stage == "spmd"
                      else dumped_after_optimizations(lowered, large_constants))


def run_case(path: Path, name: str, case, seq_stage: str, large_constants: bool,
             out_dir: Path, dist_stage: str = "after") -> Row:
    t0 = time.perf_counter()
    seq_text, dist_text = _texts(case, seq_stage, dist_stage, large_constants)
    seq_file, dist_file = out_dir / f"{name}.seq.hlo", out_dir / f"{name}.dist.hlo"
    seq_file.write_text(seq_text)
    dist_file.write_text(dist_text)
    t1 = time.perf_counter()
    try:
        res = verify_hlo(seq_file, dist_file)
    except InputError as e:   # an input error names the file and line (an unknown op, ...)
        return Row(path.name, name, case.expect, "error", t1 - t0, time.perf_counter() - t1,
                   str(e).splitlines()[0], None)
    first, located = "", None
    if not res.verified:
        first = (f"{res.failures[0].op} at line {res.failures[0].line}: {res.failures[0].message}"
                 if res.failures else "; ".join(res.outputs))
    if case.expect == "bug" and res.failures:
        line = _bug_line(case.dist)
        located = line is not None and any(fr.line == line and Path(fr.file).name == path.name
                                           for fr in res.failures[0].frames)
    return Row(path.name, name, case.expect, "verified" if res.verified else "not verified",
               t1 - t0, time.perf_counter() - t1, first[:300], located, len(res.unknowns))


def _run_cases(files: list[Path], args: argparse.Namespace, out_dir: Path) -> list[Row]:
    """Every case of `files`, its HLO pair written to `out_dir`; one line each unless --json."""
    rows = []
    for path in files:
        for name, case in _cases(path):
            row = run_case(path, name, case, args.seq, not args.elide_constants, out_dir, args.dist)
            rows.append(row)
            if not args.json:
                where = {True: "located", False: "elsewhere", None: ""}[row.located]
                print(f"{row.case:46s} {row.expect:8s} {row.verdict:12s} {where:9s} compile {row.compile_s:5.1f}s "
                      f"verify {row.verify_s:5.1f}s  {row.first_failure[:110]}", flush=True)
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--seq", choices=("before", "after"), default="before",
                    help="the sequential module before (default) or after XLA's optimisations")
    ap.add_argument("--dist", choices=("after", "spmd"), default="after",
                    help="the distributed module after optimisations (default) or right after "
                         "the SPMD partitioning pass")
    ap.add_argument("--elide-constants", action="store_true",
                    help="dump as XLA does by default: large constants elided as {...}")
    ap.add_argument("--keep", type=Path, help="write the HLO pairs here (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    files = args.files or sorted((ROOT / "examples").glob("*.py"))
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        ap.error(f"no such example file: {missing[0]}")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        rows = _run_cases(files, args, args.keep)
    else:  # (removed afterwards: a full run writes a few hundred modules)
        with tempfile.TemporaryDirectory(prefix="dlverify-xla-examples-") as tmp:
            rows = _run_cases(files, args, Path(tmp))
    correct = [r for r in rows if r.expect == "verified"]
    bugs = [r for r in rows if r.expect == "bug"]
    summary = {
        "correct_verified": sum(r.verdict == "verified" for r in correct),
        "correct": len(correct),
        "correct_errors": sum(r.verdict == "error" for r in correct),
        # false alarms whose report names an unknown value (issue 10 accepts these)
        "correct_unknown": sum(r.verdict == "not verified" and r.unknowns > 0 for r in correct),
        "bugs_not_verified": sum(r.verdict != "verified" for r in bugs),
        "bugs": len(bugs),
        "bugs_located": sum(bool(r.located) for r in bugs),
        "verify_wall_s": round(sum(r.verify_s for r in rows), 2),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "seq_stage": args.seq,
        "dist_stage": args.dist,
        "large_constants": not args.elide_constants,
    }
    if args.json:
        print(json.dumps({"cases": [asdict(r) for r in rows], "summary": summary}, indent=1))
    else:
        print(f"correct cases verified: {summary['correct_verified']} of {summary['correct']} "
              f"({summary['correct_errors']} stopped at an unsupported op, {summary['correct_unknown']} "
              f"naming an unknown elided constant); buggy twins not verified: "
              f"{summary['bugs_not_verified']} of {summary['bugs']}, located at their # BUG line: "
              f"{summary['bugs_located']}; verify {summary['verify_wall_s']} s; "
              f"peak RSS {summary['peak_rss_mib']} MiB")
    unsound = [r.case for r in bugs if r.verdict == "verified"]
    if unsound:
        print(f"UNSOUND: buggy twins verified: {unsound}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
