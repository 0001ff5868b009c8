"""`dlverify zoo`, behind the CLI's argument parsing: options checked before
anything runs (bad ones raise InputError: one line, exit 2), the run shown,
the reports written, one closing summary line; returns the exit code."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from dlverify.cli_checks import engine_ok, pattern_set, writable_dir
from dlverify.errors import InputError
from dlverify.jobs import jobs_ok
from dlverify.zoo.cache import default_cache_dir
from dlverify.zoo.items import ItemLimits, entries_of
from dlverify.zoo.runner import EXIT_INPUT, ZooOptions, run_zoo

@dataclass(frozen=True)
class ZooArgs:
    """The command line of `dlverify zoo`, as parsed."""

    targets: list[str]
    jobs: int = 1
    engine: str = "auto"
    timeout: float | None = None
    max_memory: str | None = None
    cache_dir: Path | None = None
    no_cache: bool = False
    resume: bool = False
    report_dir: Path = Path("zoo-report")
    ray: str | None = None  # --ray auto|ADDRESS: the items as Ray tasks
    rules_dir: Path | None = None  # --rules: another rule set (a folder with a main.dl)
    patterns: tuple[Path, ...] = ()  # --patterns: bug-pattern files besides the shipped ones


def options_of(args: ZooArgs) -> ZooOptions:
    from dlverify.supervise import check_seconds, parse_memory

    engine_ok(args.engine)
    jobs_ok(args.jobs)
    check_seconds(args.timeout)
    memory = parse_memory(args.max_memory) if args.max_memory is not None else None
    cache_dir = args.cache_dir or default_cache_dir()
    writable_dir(cache_dir, "--cache-dir")
    writable_dir(args.report_dir, "--report-dir")
    if args.ray is not None:
        from dlverify.zoo.ray_backend import import_ray

        if not args.ray.strip():
            raise InputError("--ray: expected auto or the address of a Ray cluster (host:port)")
        import_ray()  # missing: one line naming the extra to install
    from dlverify.rules.ruleset import checked_main

    rules_dir = checked_main(args.rules_dir).parent if args.rules_dir is not None else None
    patterns = pattern_set(list(args.patterns))
    return ZooOptions(args.jobs, args.engine, ItemLimits(args.timeout, memory), cache_dir, rules_dir=rules_dir,
                      use_cache=not args.no_cache, resume=args.resume, ray=args.ray, patterns=patterns)


def _live() -> bool:
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


def zoo_command(args: ZooArgs, echo: Callable[[str], None],
                echo_err: Callable[[str], None]) -> int:
    from dlverify.zoo.display import LineDisplay, LiveDisplay
    from dlverify.zoo.outputs import write_reports

    options = options_of(args)
    entries = entries_of(args.targets)
    display = LiveDisplay(echo) if _live() else LineDisplay(echo)
    with display:
        run = run_zoo(entries, options, display)
    code = run.code
    try:
        page = write_reports(run, args.report_dir)
        where = f"; report: {page}"
    except OSError as e:
        echo_err(f"error: writing the reports to {args.report_dir} failed: {e.strerror or e}")
        code, where = max(code, EXIT_INPUT), ""
    echo(run.summary() + where)
    return code
