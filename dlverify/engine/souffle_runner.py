"""Evaluate a program with Soufflé as a subprocess (used when `souffle` is on PATH).

Facts are written as `<dir>/<Name>.facts` (headerless TSV), Soufflé is run as
`souffle -F <facts dir> -D <out dir> -I <datalog dir> <main.dl>`, and each output
`<out dir>/<Name>.csv` is read back by the relation's declared column types.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

from dlverify.engine.dialect import Program
from dlverify.engine.facts_io import read_csv, write_facts_dir
from dlverify.errors import EngineError


def type_resolver(program: Program):
    def resolve(ty: str) -> tuple[str, tuple[str, ...]]:
        kind = program.kind(ty)
        fields = tuple(t for _, t in program.types[ty].fields) if kind == "record" else ()
        return kind, fields
    return resolve


def souffle_command(main_dl: Path, facts_dir: Path, out_dir: Path, souffle: str = "souffle") -> list[str]:
    return [souffle, "-F", str(facts_dir), "-D", str(out_dir), "-I", str(main_dl.parent), str(main_dl)]


def read_outputs(program: Program, out_dir: Path, outputs: Sequence[str]) -> dict[str, list[tuple]]:
    resolve = type_resolver(program)
    result: dict[str, list[tuple]] = {}
    for name in outputs:
        path = out_dir / f"{name}.csv"
        if not path.is_file():
            raise EngineError(f"Soufflé wrote no output file {path}")
        result[name] = read_csv(path, program.column_types(name), resolve)
    return result


def run_souffle(program: Program, main_dl: Path, facts: Mapping[str, Sequence[tuple]],
                outputs: Sequence[str], facts_dir: Path, out_dir: Path,
                timeout: float | None = None, facts_written: bool = False) -> dict[str, list[tuple]]:
    """Write the facts (unless already written), run Soufflé, read `outputs`."""
    exe = shutil.which("souffle")
    if exe is None:
        raise EngineError("`souffle` is not on PATH")
    if not facts_written:
        write_facts_dir(facts_dir, list(program.inputs), facts)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = souffle_command(main_dl.resolve(), facts_dir, out_dir, exe)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise EngineError(f"command {' '.join(cmd)} timed out after {e.timeout} s") from None
    except OSError as e:
        raise EngineError(f"command {' '.join(cmd)} could not start: {e}") from None
    if proc.returncode != 0:
        raise EngineError(f"command {' '.join(cmd)} failed with return code {proc.returncode}:\n"
                          f"{proc.stderr.strip()}")
    return read_outputs(program, out_dir, outputs)
