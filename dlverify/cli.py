"""The `dlverify` command: parses arguments and calls the library, nothing else.

Exit codes:
  0  every verdict as expected (a case expecting a bug had it found);
  1  some verdict is not what was expected (a mismatch);
  2  the input could not be verified: bad input or usage (one line naming the
     file and line), and also an internal error of dlverify, reported as one
     line `error: internal error in <phase>: <type>: <message>` (a bug: please
     report it; DLVERIFY_DEBUG=1 prints its traceback). Never a traceback else;
  3  out of time (--timeout, for the whole run) or memory (--max-memory, for
     each case or HLO pair).
When several apply, the highest wins (3 over 2 over 1). Interrupted (Ctrl-C):
130; the reader of stdout went away (`| head`): 141, quietly.

Every case (and every HLO pair or dump folder) runs in a supervised child
process (dlverify/supervise.py): the limits hold in every phase, and a case
that calls sys.exit, crashes or hangs is reported as such.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from dlverify.cli_checks import check_common, hlo_pair_ok, pattern_set, toml_ok
from dlverify.errors import InputError

EXIT_OK, EXIT_MISMATCH, EXIT_INPUT, EXIT_RESOURCES = 0, 1, 2, 3
HOST_DEVICES = 8

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Prove a distributed ML program computes what its sequential version computes.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version
        try:
            v = version("dlverify")
        except PackageNotFoundError:
            v = "unknown (not installed)"
        typer.echo(f"dlverify {v}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    """Prove a distributed ML program computes what its sequential version computes."""


def ensure_host_devices(n: int = HOST_DEVICES) -> None:
    """Ask XLA for n host CPU devices; must run before JAX is imported (and
    before the fork server of dlverify/supervise.py starts: it inherits this)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()


def _fail_input(e: InputError) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(EXIT_INPUT)


@dataclass
class _Options:
    """The options every verification command shares, checked."""

    json_out: bool
    verbose: bool
    timeout: Optional[float]
    max_memory: Optional[int]
    sarif: Optional[Path]
    junit: Optional[Path]


# ---------------------------------------------------------------------------
# running items under supervision, printing, the summary and the exit code

@dataclass
class _Errored:
    """A case that ended without a verdict."""

    name: str
    file: str
    text: str
    seconds: float


@dataclass
class _Run:
    """The state of one command's run: what finished, what failed, the exit code."""

    opts: _Options
    started: float = field(default_factory=time.monotonic)
    outcomes: list = field(default_factory=list)
    noun: str = "case"  # what an item is: a case, an HLO module pair
    errors: int = 0
    not_run: int = 0
    code: int = EXIT_OK

    @property
    def deadline(self) -> Optional[float]:
        return self.started + self.opts.timeout if self.opts.timeout else None

    def limits(self):
        from dlverify.supervise import Limits
        return Limits(seconds=None, memory_bytes=self.opts.max_memory)

    def supervise(self, task: Callable[..., Any], args: tuple, display) -> Any:
        """Run one task in a child; returns its TaskOutcome."""
        from dlverify.supervise import run_supervised
        return run_supervised(task, args, self.limits(), deadline=self.deadline,
                              on_event=display.event)

    def failed(self, outcome, name: str, file: str) -> None:
        """Report a task that did not produce a verdict; record it as an error case."""
        if outcome.status == "input_error":
            text = str(outcome.input_error())
            self._raise_code(EXIT_INPUT)
        elif outcome.status == "out_of_time":
            text = (f"out of time: the run's limit of {self.opts.timeout:g} s was reached while in "
                    f"phase {outcome.phase}" + (f" of {name}" if name else ""))
            self._raise_code(EXIT_RESOURCES)
        elif outcome.hit_limit:
            text = f"{name}: {outcome.message}" if name else outcome.message
            self._raise_code(EXIT_RESOURCES)
        elif outcome.status == "crashed":  # the user's code may have done it: no blame
            text = f"{file}: {name + ': ' if name else ''}{outcome.message}"
            self._raise_code(EXIT_INPUT)
        else:
            text = outcome.message if not name else f"{outcome.message} (in {name})"
            self._raise_code(EXIT_INPUT)
        typer.echo(f"error: {text}", err=True)
        if name:  # kept light: CaseOutcome (and the verifier) is imported only if reported
            self.errors += 1
            self.outcomes.append(_Errored(name, file, text, outcome.seconds))

    def finished(self, item) -> None:
        """A verdict (a tasks.ItemRun): printed, counted."""
        self.print_lines(item.lines)
        if not item.matches:
            self._raise_code(EXIT_MISMATCH)
        self.outcomes.append(item)

    def _raise_code(self, code: int) -> None:
        # 3 (limits) over 2 (input) over 1 (mismatch) over 0
        self.code = max(self.code, code)

    def print_lines(self, lines: list[str]) -> None:
        if not self.opts.json_out:
            for line in lines:
                typer.echo(line)

    def finish(self) -> None:
        """The JSON report, SARIF and JUnit files, the summary line; then exit."""
        if self.opts.json_out and self.outcomes:
            from dlverify.reports.json_report import outcomes_json
            typer.echo(outcomes_json(self._case_outcomes()))
        try:
            if self.opts.sarif is not None or self.opts.junit is not None:
                from dlverify.artifacts import write_outputs
                for note in write_outputs(self._case_outcomes(), sarif=self.opts.sarif,
                                          junit=self.opts.junit):
                    typer.echo(note, err=True)
        except OSError as e:
            typer.echo(f"error: writing a report failed: {e}", err=True)
            self._raise_code(EXIT_INPUT)
        # one item that ended in an error: the error line says it all (bad input
        # is one line); otherwise the summary closes the report
        verdicts = [o for o in self.outcomes if not isinstance(o, _Errored)]
        if not self.opts.json_out and (verdicts or len(self.outcomes) + self.not_run > 1):
            typer.echo(self.summary())
        raise typer.Exit(self.code)

    def _case_outcomes(self) -> list:
        from dlverify.verdict import CaseOutcome
        return [CaseOutcome(o.name, o.file, "verified", None, error=o.text, seconds=o.seconds)
                if isinstance(o, _Errored) else o.outcome() for o in self.outcomes]

    def summary(self) -> str:
        status = ["error" if isinstance(o, _Errored) else o.status for o in self.outcomes]
        n = len(self.outcomes) + self.not_run
        bugs, mismatches, errors = (status.count(k) for k in ("expected", "mismatch", "error"))
        text = (f"summary: {_count(n, self.noun)}: {status.count('ok')} verified, "
                f"{_count(bugs, 'bug')} found as expected, {_count(mismatches, 'mismatch')}, "
                f"{_count(errors, 'error')}")
        if self.not_run:
            text += f", {self.not_run} not run"
        return text + f"; {time.monotonic() - self.started:.1f}s"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('ch') else 's'}"


class _Display:
    """A progress line on a terminal (rich), for long runs: cases done, the
    current case and its phase, segments within it. Silent under --json or
    when stderr is not a terminal."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.progress = None
        self.total = total
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
        self.cases = self.progress.add_task("cases", total=total)
        self.detail = self.progress.add_task("", total=None, visible=False)
        self.name = ""

    def __enter__(self) -> "_Display":
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def start(self, name: str) -> None:
        self.name = name
        if self.progress is not None:
            self.progress.update(self.cases, description=f"{name}")
            self.progress.update(self.detail, visible=False)

    def done(self) -> None:
        if self.progress is not None:
            self.progress.advance(self.cases)

    def event(self, ev) -> None:
        if self.progress is None:
            return
        if ev.kind == "phase":
            self.progress.update(self.cases, description=f"{self.name} ({ev.phase})")
        elif ev.kind == "progress":
            self.progress.update(self.detail, description=f"  {ev.phase}", completed=ev.done,
                                 total=ev.total, visible=True)


def _display_enabled(json_out: bool) -> bool:
    return not json_out and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def _run_command(body: Callable[[], None]) -> None:
    """Bad options exit 2 with one line; anything unexpected becomes one
    'internal error' line, never a traceback."""
    try:
        body()
    except typer.Exit:
        raise
    except InputError as e:
        _fail_input(e)
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        raise typer.Exit(130)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as cat does
        raise typer.Exit(141)
    except MemoryError:
        typer.echo("error: out of memory", err=True)
        raise typer.Exit(EXIT_RESOURCES)
    except Exception as e:  # noqa: BLE001: the promise is one line, never a traceback
        if os.environ.get("DLVERIFY_DEBUG"):
            raise
        text = " ".join(str(e).split())[:500]
        typer.echo(f"error: internal error in cli: {type(e).__name__}: {text}", err=True)
        raise typer.Exit(EXIT_INPUT)


TIMEOUT_HELP = "seconds for the whole run (exit 3 when exceeded)"
MEMORY_HELP = "memory for each case or HLO pair, e.g. 4G or 512M (exit 3 when exceeded)"
CACHE_HELP = ("keep segment results on disk under DIR and reuse them in later runs "
              "(keyed by content, rules and version); off by default")
RULES_HELP = "another rule set: a folder with a main.dl, checked against the schema (README 'Rule-set research')"
JOBS_HELP = ("{units} verified at once, each in its own process; the report is the same "
             "for any N")
PATTERNS_HELP = "a bug-pattern file (TOML) matched on failures besides the shipped ones; repeatable (README 'Bug-pattern queries')"


@app.command("check-jax")
def check_jax(
    target: str = typer.Argument(..., help="PATH.py (every case) or PATH.py::NAME (one case)"),
    json_out: bool = typer.Option(False, "--json", help="print the versioned JSON report"),
    engine: str = typer.Option("auto", help="auto | clingo | souffle"),
    keep_facts: Optional[Path] = typer.Option(None, "--keep-facts", help="keep the fact tables (TSV) under DIR/<case>"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="all failures, assumptions, timings"),
    explain: Optional[str] = typer.Option(None, "--explain", help="derivation of OUTPUT (e.g. out0 or out0@1 for rank 1)"),
    graph: Optional[Path] = typer.Option(None, "--graph", help="write the failing subgraph (.dot, or .svg with Graphviz); one file per case when several"),
    witness: bool = typer.Option(False, "--witness", help="run both programs on random inputs and report the differences"),
    sarif: Optional[Path] = typer.Option(None, "--sarif", help="write a SARIF 2.1.0 log of the failures"),
    junit: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML, one testcase per case"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help=TIMEOUT_HELP),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help=MEMORY_HELP),
    cache: Optional[Path] = typer.Option(None, "--cache", help=CACHE_HELP),
    rules: Optional[Path] = typer.Option(None, "--rules", help=RULES_HELP),
    patterns: Optional[list[Path]] = typer.Option(None, "--patterns", help=PATTERNS_HELP),
    jobs: int = typer.Option(1, "--jobs", "-j", help=JOBS_HELP.format(units="cases")),
) -> None:
    """Verify the @dlverify.case functions of a Python file."""
    def body() -> None:
        from dlverify.jobs import Unit, jobs_ok, run_units
        from dlverify.tasks import CaseJob, Extras, list_cases_task, run_case_task, split_target

        jobs_ok(jobs)
        memory = check_common(engine, timeout, max_memory, explain,
                               {"--sarif": sarif, "--junit": junit, "--graph": graph}, keep_facts,
                               cache, rules)
        pattern_list = pattern_set(patterns)
        ensure_host_devices()
        run = _Run(_Options(json_out, verbose, timeout, memory, sarif, junit))
        path, name = split_target(target)
        with _Display(False, 0) as quiet:
            listed = run.supervise(list_cases_task, (path, name), quiet)
        if not listed.ok:
            run.failed(listed, "", str(path))
            run.finish()
        names = listed.value
        units = []
        for case_name in names:
            one_graph = graph if graph is None or len(names) == 1 \
                else graph.with_name(f"{graph.stem}.{case_name}{graph.suffix}")
            job = CaseJob(path, case_name, engine, keep_facts,
                          Extras(explain, witness, one_graph, verbose), cache, rules, pattern_list)
            units.append(Unit(case_name, run_case_task, (job,)))
        with _Display(_display_enabled(json_out) and len(names) > 1, len(names)) as display:
            for unit, got in run_units(units, jobs, run.limits(), run.deadline, display.start,
                                       display.event):
                display.done()
                if got is None:  # the run's time was up before it started
                    run.not_run += 1
                elif got.ok:
                    run.finished(got.value)
                else:
                    run.failed(got, unit.name, str(path))
        run.finish()

    _run_command(body)


def _run_hlo(job, opts: _Options, jobs: int = 1) -> None:
    """Verify an HLO pair or a dump folder in a child (a dump folder's module
    pairs in one child each with --jobs N > 1); print; exit."""
    from dlverify.jobs import run_dump_units
    from dlverify.tasks import run_hlo_task

    ensure_host_devices()
    run = _Run(opts, noun="module pair")
    with _Display(_display_enabled(opts.json_out), 1) as display:
        display.start(str(job.dump_dir or job.dist))
        if job.dump_dir is not None and jobs > 1:
            got = run_dump_units(job, jobs, run.limits(), run.deadline, display.start,
                                 display.event)
        else:
            got = run.supervise(run_hlo_task, (job,), display)
    if got.ok:
        for item in got.value:
            run.finished(item)
    else:
        name = f"{job.seq.name} vs {job.dist.name}" if job.dump_dir is None else ""
        run.failed(got, name, str(job.dist or job.dump_dir))
    run.finish()


@app.command("check")
def check_hlo(
    seq: Path = typer.Argument(..., help="the sequential HLO text module"),
    dist: Path = typer.Argument(..., help="the distributed (SPMD, per-rank) HLO text module"),
    ranks: Optional[int] = typer.Option(None, "--ranks", help="number of ranks (default: the spec's ranks, else num_partitions * replica_count)"),
    spec: Optional[Path] = typer.Option(None, "--spec", help="relation spec (TOML): its params table relates each input, its optional outputs table gives the expected output relations"),
    custom_calls: Optional[Path] = typer.Option(None, "--custom-calls", help="custom-call registry TOML merged over the built-in one"),
    json_out: bool = typer.Option(False, "--json", help="print the versioned JSON report"),
    engine: str = typer.Option("auto", help="auto | clingo | souffle"),
    keep_facts: Optional[Path] = typer.Option(None, "--keep-facts", help="keep the fact tables (TSV) under DIR"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="all failures, notes, timings"),
    explain: Optional[str] = typer.Option(None, "--explain", help="derivation of OUTPUT (e.g. out0 or out0@1 for rank 1)"),
    witness: bool = typer.Option(False, "--witness", help="run both modules on random inputs (IR interpreter) and report the differences"),
    graph: Optional[Path] = typer.Option(None, "--graph", help="write the failing subgraph (.dot, or .svg with Graphviz)"),
    sarif: Optional[Path] = typer.Option(None, "--sarif", help="write a SARIF 2.1.0 log of the failures"),
    junit: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML, one testcase per module pair"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help=TIMEOUT_HELP),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help=MEMORY_HELP),
    cache: Optional[Path] = typer.Option(None, "--cache", help=CACHE_HELP),
    rules: Optional[Path] = typer.Option(None, "--rules", help=RULES_HELP),
    patterns: Optional[list[Path]] = typer.Option(None, "--patterns", help=PATTERNS_HELP),
) -> None:
    """Verify a distributed HLO module against a sequential one."""
    def body() -> None:
        from dlverify.tasks import Extras, HloJob

        memory = check_common(engine, timeout, max_memory, explain,
                               {"--sarif": sarif, "--junit": junit, "--graph": graph}, keep_facts,
                               cache, rules)
        hlo_pair_ok(seq, dist, ranks, spec, custom_calls)
        job = HloJob(seq=seq, dist=dist, spec=spec, ranks=ranks, engine=engine,
                     custom_calls=custom_calls, keep_facts=keep_facts,
                     extras=Extras(explain, witness, graph, verbose), cache_dir=cache, rules_dir=rules,
                     patterns=pattern_set(patterns))
        _run_hlo(job, _Options(json_out, verbose, timeout, memory, sarif, junit))

    _run_command(body)


@app.command("check-dump")
def check_dump(
    dump_dir: Path = typer.Argument(..., help="a folder written with --xla_dump_to"),
    custom_calls: Optional[Path] = typer.Option(None, "--custom-calls", help="custom-call registry TOML merged over the built-in one"),
    json_out: bool = typer.Option(False, "--json", help="print the versioned JSON report"),
    engine: str = typer.Option("auto", help="auto | clingo | souffle"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="all failures, notes, timings"),
    explain: Optional[str] = typer.Option(None, "--explain", help="derivation of OUTPUT (e.g. out0 or out0@1 for rank 1)"),
    witness: bool = typer.Option(False, "--witness", help="run both modules on random inputs (IR interpreter) and report the differences"),
    graph: Optional[Path] = typer.Option(None, "--graph", help="write the failing subgraphs (.dot, or .svg with Graphviz): NAME.<module>.dot, one file per module"),
    sarif: Optional[Path] = typer.Option(None, "--sarif", help="write a SARIF 2.1.0 log of the failures"),
    junit: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML, one testcase per module pair"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help=TIMEOUT_HELP),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help=MEMORY_HELP),
    cache: Optional[Path] = typer.Option(None, "--cache", help=CACHE_HELP),
    rules: Optional[Path] = typer.Option(None, "--rules", help=RULES_HELP),
    patterns: Optional[list[Path]] = typer.Option(None, "--patterns", help=PATTERNS_HELP),
    jobs: int = typer.Option(1, "--jobs", "-j", help=JOBS_HELP.format(units="module pairs")),
) -> None:
    """Verify every SPMD-partitioned module of an XLA dump folder (before
    optimisations vs after SPMD partitioning, else after optimisations)."""
    def body() -> None:
        from dlverify.jobs import jobs_ok
        from dlverify.tasks import Extras, HloJob

        jobs_ok(jobs)

        memory = check_common(engine, timeout, max_memory, explain,
                               {"--sarif": sarif, "--junit": junit, "--graph": graph},
                               cache=cache, rules=rules)
        if not dump_dir.is_dir():
            raise InputError("not a directory (expected an XLA dump folder written with "
                             "--xla_dump_to)", str(dump_dir))
        toml_ok(custom_calls, "--custom-calls")
        job = HloJob(dump_dir=dump_dir, engine=engine, custom_calls=custom_calls,
                     extras=Extras(explain, witness, graph, verbose), cache_dir=cache, rules_dir=rules,
                     patterns=pattern_set(patterns))
        _run_hlo(job, _Options(json_out, verbose, timeout, memory, sarif, junit), jobs)

    _run_command(body)


@app.command("spec")
def spec_cmd(
    seq: Path = typer.Argument(..., help="the sequential HLO text module"),
    dist: Path = typer.Argument(..., help="the distributed (SPMD, per-rank) HLO text module"),
    out: Optional[Path] = typer.Option(None, "--output", "-o", help="write the spec here instead of stdout"),
    spec: Optional[Path] = typer.Option(None, "--spec", help="a partial spec whose statements are kept (e.g. its [dist_params])"),
    ranks: Optional[int] = typer.Option(None, "--ranks", help="number of ranks (default: the spec's, the module's, else the collectives')"),
    custom_calls: Optional[Path] = typer.Option(None, "--custom-calls", help="custom-call registry TOML merged over the built-in one"),
    engine: str = typer.Option("auto", help="auto | clingo | souffle"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help=TIMEOUT_HELP),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help=MEMORY_HELP),
) -> None:
    """Print the relation spec dlverify infers for an HLO pair, one evidence comment per
    entry (exit 0 if the pair verifies under it, 1 if not)."""
    def body() -> None:
        from dlverify.tasks import SpecJob, run_spec_task

        memory = check_common(engine, timeout, max_memory, None, {}, None, None, None)
        hlo_pair_ok(seq, dist, ranks, spec, custom_calls)
        run = _Run(_Options(False, False, timeout, memory, None, None), noun="module pair")
        with _Display(_display_enabled(False), 1) as display:
            display.start(str(dist))
            got = run.supervise(run_spec_task, (SpecJob(seq, dist, spec, ranks, engine,
                                                        custom_calls),), display)
        if not got.ok:
            run.failed(got, "", str(dist))
            raise typer.Exit(run.code)
        if out is not None:
            out.write_text(got.value.text, encoding="utf-8")
        else:
            typer.echo(got.value.text, nl=False)
        raise typer.Exit(EXIT_OK if got.value.verified else EXIT_MISMATCH)

    _run_command(body)


@app.command("zoo")
def zoo(
    targets: list[str] = typer.Argument(..., help="manifest .toml, case files (PATH.py[::NAME]), folders, globs"),
    jobs: int = typer.Option(1, "--jobs", "-j", help="items verified at once"),
    engine: str = typer.Option("auto", help="auto | clingo | souffle"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="seconds for EACH item (exit 3 if one exceeds it)"),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="memory for each item, e.g. 4G (exit 3 if one exceeds it)"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="verdict cache (default ~/.cache/dlverify/zoo)"),
    no_cache: bool = typer.Option(False, "--no-cache", help="neither read nor write cached verdicts"),
    resume: bool = typer.Option(False, "--resume", help="keep the items an interrupted run finished"),
    rules: Optional[Path] = typer.Option(None, "--rules", help=RULES_HELP),
    report_dir: Path = typer.Option(Path("zoo-report"), "--report-dir", help="index.html, zoo.json, junit.xml, zoo.sarif"),
    ray: Optional[str] = typer.Option(None, "--ray", help="auto | ADDRESS: the items as Ray tasks (pip install 'dlverify\\[ray]')"),
    patterns: Optional[list[Path]] = typer.Option(None, "--patterns", help=PATTERNS_HELP),
) -> None:
    """Verify a model zoo on a pool of processes, with a cache and an HTML report (see README)."""
    def body() -> None:
        from dlverify.zoo.command import ZooArgs, zoo_command

        ensure_host_devices()
        args = ZooArgs(targets, jobs, engine, timeout, max_memory, cache_dir, no_cache, resume, report_dir, ray,
                       rules_dir=rules, patterns=tuple(patterns or ()))
        raise typer.Exit(zoo_command(args, typer.echo, lambda line: typer.echo(line, err=True)))

    _run_command(body)


from dlverify.rules.command import rules_app  # noqa: E402: the `rules` command group
app.add_typer(rules_app, name="rules")


def main() -> None:
    code = 0
    try:
        app()
    except KeyboardInterrupt:
        code = 130
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        from dlverify.supervise import shutdown
        shutdown()
    # Everything is written: skip the interpreter's teardown (half a second
    # under load, counted against --timeout by whoever waits for us).
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or EXIT_INPUT
    os._exit(code)


if __name__ == "__main__":
    main()
