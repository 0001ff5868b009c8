"""The `dlverify` command: parses arguments and calls the library, nothing else.

Exit codes: 0 every verdict as expected, 1 otherwise, 2 bad input or usage,
3 out of time or memory.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

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
    if engine not in ("auto", "clingo", "souffle"):
        _fail_input(InputError(f"unknown engine {engine!r}: use auto, clingo or souffle"))
    ensure_host_devices()
    from dlverify.cases import load_cases, run_case, split_target
    from dlverify.limits import OutOfTime, time_limit
    from dlverify.artifacts import case_extras, write_outputs
    from dlverify.report import outcome_text, outcomes_json

    path, name = split_target(target)
    outcomes = []
    try:
        with time_limit(timeout):
            cases = load_cases(path, name)
            for case_name, fn in cases:
                o = run_case(path, case_name, fn, engine, keep_facts)
                extra = case_extras(o, explain=explain, witness=witness,
                                    graph=graph if len(cases) == 1 or graph is None
                                    else graph.with_name(f"{graph.stem}.{case_name}{graph.suffix}"))
                outcomes.append(o)
                if not json_out:
                    for line in outcome_text(o, verbose) + extra:
                        typer.echo(line)
    except InputError as e:
        _fail_input(e)
    except OutOfTime as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_RESOURCES)
    except MemoryError:
        typer.echo("error: out of memory", err=True)
        raise typer.Exit(EXIT_RESOURCES)
    if json_out:
        typer.echo(outcomes_json(outcomes))
    for note in write_outputs(outcomes, sarif=sarif, junit=junit):
        typer.echo(note, err=True)
    raise typer.Exit(EXIT_OK if all(o.matches for o in outcomes) else EXIT_MISMATCH)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
