"""Shared test set-up: host CPU devices for JAX, and the example cases."""
import os

# Before JAX is imported anywhere: 8 host devices, and collectives printed with
# explicit replica groups.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_enable_rgv3_materialization=false")

import inspect  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def example_targets() -> list[tuple[Path, str]]:
    """(file, case name) of every case under examples/, found without running them."""
    import re

    out = []
    for path in sorted(EXAMPLES.rglob("*.py")):
        text = path.read_text()
        for m in re.finditer(r"@dlverify\.case\s*\ndef (\w+)\(", text):
            out.append((path, m.group(1)))
    return out


def bug_line(dist_fn) -> int:
    """The line marked `# BUG` inside the local function of a shard_map program."""
    fn = dist_fn
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    lines, start = inspect.getsourcelines(fn)
    marked = [start + i for i, line in enumerate(lines) if "# BUG" in line]
    assert len(marked) == 1, f"{fn.__name__}: expected exactly one '# BUG' line, found {marked}"
    return marked[0]
