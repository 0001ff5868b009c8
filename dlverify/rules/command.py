"""`dlverify rules stats|check`: the command group of rule-set research (README
"Rule-set research"). Exit codes as in dlverify/cli.py: 0 fine, 1 an unsound rule
found (check), 2 bad input (a rule set that does not fit the schema, a bad target:
one line naming the file and line)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

rules_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Rule-set research: per-rule statistics and numeric soundness fuzzing.")

EXIT_OK, EXIT_UNSOUND, EXIT_INPUT = 0, 1, 2


@rules_app.command("stats")
def stats(
    targets: list[str] = typer.Argument(..., help="manifest .toml, case files (PATH.py[::NAME]), folders, globs (as for zoo)"),
    rules: Optional[Path] = typer.Option(None, "--rules", help="the rule set: a folder with a main.dl (default: the installed rules)"),
    json_out: bool = typer.Option(False, "--json", help="print the statistics as JSON"),
    heatmap: Optional[Path] = typer.Option(None, "--heatmap", help="write a heatmap of rules by model (SVG)"),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="seconds for EACH model's evaluation"),
) -> None:
    """How many tuples each rule derives, per model (a table, JSON, a heatmap SVG)."""
    from dlverify.cli import _run_command, ensure_host_devices
    from dlverify.cli_checks import writable_file

    def body() -> None:
        from rich.console import Console

        from dlverify.rules.render import heatmap_svg, stats_table
        from dlverify.rules.ruleset import load_rule_set
        from dlverify.rules.stats import rule_stats
        from dlverify.supervise import check_seconds

        check_seconds(timeout)
        writable_file(heatmap, "--heatmap")
        rule_set = load_rule_set(rules)
        ensure_host_devices()
        err = Console(stderr=True)
        report = rule_stats(rule_set, targets, timeout,
                            progress=None if json_out else lambda name: err.print(f"[dim]running {name}[/dim]"))
        if json_out:
            typer.echo(json.dumps(report.to_json(), indent=1))
        else:
            Console(width=200).print(stats_table(report))
        if heatmap is not None:
            heatmap.write_text(heatmap_svg(report), encoding="utf-8")
        failed = [m for m in report.models if m.error]
        for m in failed:
            typer.echo(f"error: {m.error}", err=True)
        raise typer.Exit(EXIT_INPUT if failed else EXIT_OK)

    _run_command(body)


@rules_app.command("check")
def check(
    rules_dir: Optional[Path] = typer.Argument(None, help="the rule set: a folder with a main.dl (default: the installed rules)"),
    seed: int = typer.Option(0, "--seed", help="random seed (the same seed, the same programs)"),
    trials: int = typer.Option(200, "--trials", help="random program pairs to try at most"),
    seconds: float = typer.Option(60.0, "--time", help="seconds to fuzz at most"),
    max_steps: int = typer.Option(6, "--max-steps", help="ops per random program at most"),
    first: bool = typer.Option(False, "--first", help="stop at the first unsound rule found"),
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Fuzz every View rule numerically on random tiny program pairs; exit 1 with a
    counterexample for each unsound rule."""
    from dlverify.cli import _run_command

    def body() -> None:
        from dlverify.errors import InputError
        from dlverify.rules.fuzz import check_rules
        from dlverify.rules.render import check_json, check_lines
        from dlverify.rules.ruleset import load_rule_set

        if trials < 1 or seconds <= 0 or max_steps < 1:
            raise InputError("--trials and --max-steps must be at least 1 and --time positive")
        report = check_rules(load_rule_set(rules_dir), trials, seconds, seed, max_steps, first)
        if json_out:
            typer.echo(json.dumps(check_json(report), indent=1))
        else:
            for line in check_lines(report):
                typer.echo(line)
        raise typer.Exit(EXIT_OK if report.sound else EXIT_UNSOUND)

    _run_command(body)
