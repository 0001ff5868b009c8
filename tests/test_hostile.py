"""The hostile-input corpus (tests/data/hostile/*/expected.toml, format in
tests/data/hostile/make_corpus.py): every input ends with its documented exit
code, with one-line errors and never a traceback or an internal error.

The CLI runs in-process through typer's CliRunner; the limits still hold
because every case runs in a supervised child process. An entry with
`subprocess = true` runs `python -m dlverify.cli` instead."""
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlverify.cli import app

HOSTILE = Path(__file__).resolve().parent / "data" / "hostile"
DATA = HOSTILE.parent


def _entries():
    out = []
    for manifest in sorted(HOSTILE.rglob("expected.toml")):
        with open(manifest, "rb") as f:
            files = tomllib.load(f).get("files", {})
        for name, entry in files.items():
            out.append(pytest.param(manifest.parent, name, entry,
                                    id=f"{manifest.parent.relative_to(HOSTILE)}/{name}"))
    return out


ENTRIES = _entries()


def test_the_corpus_is_big_enough():
    assert len(ENTRIES) >= 150, len(ENTRIES)


def _args(folder: Path, name: str, entry: dict, tmp: Path) -> list[str]:
    target = folder / entry.get("file", name)
    return [a.replace("{file}", str(target)).replace("{dir}", str(folder))
             .replace("{tmp}", str(tmp)).replace("{data}", str(DATA)) for a in entry["args"]]


def _run(args: list[str], in_subprocess: bool) -> tuple[int, str, str]:
    if in_subprocess:
        p = subprocess.run([sys.executable, "-m", "dlverify.cli", *args], capture_output=True,
                           text=True, timeout=300)
        return p.returncode, p.stdout, p.stderr
    res = CliRunner().invoke(app, args)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"the CLI raised {type(res.exception).__name__}: {res.exception}")
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize("folder,name,entry", ENTRIES)
def test_hostile_input(folder, name, entry, tmp_path):
    code, out, err = _run(_args(folder, name, entry, tmp_path), entry.get("subprocess", False))
    both = out + err
    assert "Traceback" not in both, both[-3000:]
    assert "internal error" not in both, err[-3000:]
    assert code == entry["exit"], f"exit {code}, documented {entry['exit']}:\n{both[-3000:]}"
    if entry.get("contains"):
        assert entry["contains"] in both, both[-3000:]
    if code in (2, 3):
        assert "error" in err.lower(), both[-3000:]
