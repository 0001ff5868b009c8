"""The `dlverify` command: parses arguments and calls the library, nothing else.

Exit codes: 0 every verdict as expected, 1 otherwise, 2 bad input or usage,
3 out of time or memory.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import typer

from dlverify.errors import InputError

EXIT_OK, EXIT_MISMATCH, EXIT_INPUT, EXIT_RESOURCES = 0, 1, 2, 3
HOST_DEVICES = 8

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Prove a distributed ML program computes what its sequential version computes.")


@app.callback()
def _root() -> None:
    """Prove a distributed ML program computes what its sequential version computes."""


def ensure_host_devices(n: int = HOST_DEVICES) -> None:
    """Ask XLA for n host CPU devices; must run before JAX is imported."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={n}").strip()


def _fail_input(e: InputError) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(EXIT_INPUT)


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
    timeout: Optional[float] = typer.Option(None, "--timeout", help="seconds for the whole run (exit 3 when exceeded)"),
) -> None:
    """Verify the @dlverify.case functions of a Python file."""
    _engine_ok(engine)
    ensure_host_devices()
    from dlverify.artifacts import case_extras, write_outputs
    from dlverify.cases import load_cases, run_case, split_target
    from dlverify.reports.json_report import outcomes_json
    from dlverify.reports.text import outcome_text

    path, name = split_target(target)
    outcomes = []
    with _guarded(timeout):
        cases = load_cases(path, name)
        for case_name, fn in cases:
            o = run_case(path, case_name, fn, engine, keep_facts)
            one_graph = graph if graph is None or len(cases) == 1 \
                else graph.with_name(f"{graph.stem}.{case_name}{graph.suffix}")
            extra = case_extras(o, explain=explain, witness=witness, graph=one_graph)
            outcomes.append(o)
            if not json_out:
                for line in outcome_text(o, verbose) + extra:
                    typer.echo(line)
    if json_out:
        typer.echo(outcomes_json(outcomes))
    for note in write_outputs(outcomes, sarif=sarif, junit=junit):
        typer.echo(note, err=True)
    raise typer.Exit(EXIT_OK if all(o.matches for o in outcomes) else EXIT_MISMATCH)


@contextmanager
def _guarded(timeout: Optional[float]) -> Iterator[None]:
    """Run the body under the time limit; bad input exits 2, time or memory 3."""
    from dlverify.limits import OutOfTime, time_limit

    try:
        with time_limit(timeout):
            yield
    except InputError as e:
        _fail_input(e)
    except OutOfTime as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_RESOURCES)
    except MemoryError:
        typer.echo("error: out of memory", err=True)
        raise typer.Exit(EXIT_RESOURCES)


def _engine_ok(engine: str) -> None:
    if engine not in ("auto", "clingo", "souffle"):
        _fail_input(InputError(f"unknown engine {engine!r}: use auto, clingo or souffle"))


def _run_hlo(job, json_out: bool, verbose: bool, timeout: Optional[float],
             explain: Optional[str] = None, witness: bool = False, graph: Optional[Path] = None,
             sarif: Optional[Path] = None, junit: Optional[Path] = None) -> None:
    """Run `job()` -> [(name, file, Result, seconds)], print, exit 0/1 (2, 3 on errors)."""
    from dlverify.artifacts import case_extras, write_outputs
    from dlverify.verdict import CaseOutcome
    from dlverify.hlo_api import result_lines, results_json

    with _guarded(timeout):
        items = job()
        outcomes = [CaseOutcome(name, file, "verified", res, seconds=secs)
                    for name, file, res, secs in items]
        for o, (name, _file, res, secs) in zip(outcomes, items):
            one_graph = graph if graph is None or len(items) == 1 \
                else graph.with_name(f"{graph.stem}.{len(outcomes)}{graph.suffix}")
            extra = case_extras(o, explain=explain, witness=witness, graph=one_graph)
            if not json_out:
                for line in result_lines(name, res, secs, verbose) + extra:
                    typer.echo(line)
    if json_out:
        typer.echo(results_json(items))
    for note in write_outputs(outcomes, sarif=sarif, junit=junit):
        typer.echo(note, err=True)
    raise typer.Exit(EXIT_OK if all(res.verified for _, _, res, _ in items) else EXIT_MISMATCH)


@app.command("check")
def check_hlo(
    seq: Path = typer.Argument(..., help="the sequential HLO text module"),
    dist: Path = typer.Argument(..., help="the distributed (SPMD, per-rank) HLO text module"),
    ranks: Optional[int] = typer.Option(None, "--ranks", help="number of ranks (default: the spec's ranks, else num_partitions * replica_count)"),
    spec: Optional[Path] = typer.Option(None, "--spec", help="relation spec TOML ([params], optional [outputs])"),
    custom_calls: Optional[Path] = typer.Option(None, "--custom-calls", help="custom-call registry TOML merged over the built-in one"),
    json_out: bool = typer.Option(False, "--json", help="print the versioned JSON report"),
    engine: str = typer.Option("auto", help="auto | clingo | souffle"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="all failures, notes, timings"),
    explain: Optional[str] = typer.Option(None, "--explain", help="derivation of OUTPUT (e.g. out0 or out0@1 for rank 1)"),
    witness: bool = typer.Option(False, "--witness", help="run both modules on random inputs (IR interpreter) and report the differences"),
    graph: Optional[Path] = typer.Option(None, "--graph", help="write the failing subgraph (.dot, or .svg with Graphviz)"),
    sarif: Optional[Path] = typer.Option(None, "--sarif", help="write a SARIF 2.1.0 log of the failures"),
    junit: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML, one testcase per module pair"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="seconds for the whole run (exit 3 when exceeded)"),
) -> None:
    """Verify a distributed HLO module against a sequential one."""
    _engine_ok(engine)
    if ranks is not None and ranks < 1:
        _fail_input(InputError(f"--ranks must be positive, got {ranks}"))

    def job():
        import time

        from dlverify.hlo_api import verify_hlo
        t0 = time.perf_counter()
        res = verify_hlo(seq, dist, spec, ranks=ranks, engine=engine, custom_calls=custom_calls)
        return [(f"{seq.name} vs {dist.name}", str(dist), res, time.perf_counter() - t0)]

    _run_hlo(job, json_out, verbose, timeout, explain, witness, graph, sarif, junit)


@app.command("check-dump")
def check_dump(
    dump_dir: Path = typer.Argument(..., help="a folder written with --xla_dump_to"),
    custom_calls: Optional[Path] = typer.Option(None, "--custom-calls", help="custom-call registry TOML merged over the built-in one"),
    json_out: bool = typer.Option(False, "--json", help="print the versioned JSON report"),
    engine: str = typer.Option("auto", help="auto | clingo | souffle"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="all failures, notes, timings"),
    explain: Optional[str] = typer.Option(None, "--explain", help="derivation of OUTPUT (e.g. out0 or out0@1 for rank 1)"),
    witness: bool = typer.Option(False, "--witness", help="run both modules on random inputs (IR interpreter) and report the differences"),
    graph: Optional[Path] = typer.Option(None, "--graph", help="write the failing subgraph (.dot, or .svg with Graphviz)"),
    sarif: Optional[Path] = typer.Option(None, "--sarif", help="write a SARIF 2.1.0 log of the failures"),
    junit: Optional[Path] = typer.Option(None, "--junit", help="write JUnit XML, one testcase per module pair"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="seconds for the whole run (exit 3 when exceeded)"),
) -> None:
    """Verify every SPMD-partitioned module of an XLA dump folder (before
    optimisations vs after SPMD partitioning, else after optimisations)."""
    _engine_ok(engine)

    def job():
        import time

        from dlverify.hlo_api import verify_dump
        t0 = time.perf_counter()
        out = verify_dump(dump_dir, engine=engine, custom_calls=custom_calls)
        secs = (time.perf_counter() - t0) / max(1, len(out))
        return [(res.name or name, name, res, secs) for name, res in out]

    _run_hlo(job, json_out, verbose, timeout, explain, witness, graph, sarif, junit)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
