"""Which segments of a segmented run (dlverify/segments.py) depend on which:
segment j depends on segment i when a view i derived first is one of j's seeds.
Prints, per program, the segment count, the longest dependency chain and the
most segments that share one depth of that chain (more than 1 would be
segments that could run side by side, e.g. under a process pool).

    python bench/segment_deps.py                 # Llama-3.1-405B shapes, forward, 8 layers
    python bench/segment_deps.py --layers 126 --train

Measured 2026-11 (issue 11, `--jobs`): the forward at 8 and 126 layers (9 and
127 segments) and the TP=4 training step at 8 layers (20 segments) are each one
chain: longest chain = segment count, one segment per depth. The windows are
also chosen from the views derived so far, so the next window is not known
before the previous one ends.

Reads the runner's private steps (_window_tables, views_back): an analysis
aid, not an API.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "models"))

import llama3  # noqa: E402

import dlverify.segments as SG  # noqa: E402
from dlverify.api import verify_problem  # noqa: E402
from dlverify.frontends.jaxpr import import_jax  # noqa: E402


class Recorder:
    """Each window's seeds and derived views, through the runner's own steps."""

    def __init__(self) -> None:
        self.windows: list[dict] = []
        self._tables, self._back = SG._window_tables, SG.views_back

    def __enter__(self) -> "Recorder":
        def tables(index, order, seeds, *rest):   # (rest: the padded seeds)
            self.windows.append({"seeds": set(seeds), "derived": None})
            return self._tables(index, order, seeds, *rest)

        def back(canon, rows):
            out = self._back(canon, rows)
            self.windows[-1]["derived"] = out
            return out
        SG._window_tables, SG.views_back = tables, back
        return self

    def __exit__(self, *exc) -> None:
        SG._window_tables, SG.views_back = self._tables, self._back


def dependencies(windows: list[dict]) -> dict:
    # (the outputs' judgement after the last segment builds tables too, derives no view)
    windows = [w for w in windows if w["derived"] is not None]
    producer: dict = {}
    depth: list[int] = []
    for j, w in enumerate(windows):
        deps = {producer[r] for r in w["seeds"] if r in producer}
        depth.append(1 + max((depth[i] for i in deps), default=0))
        for r in w["derived"]:
            producer.setdefault(r, j)
    per_depth: dict[int, int] = {}
    for d in depth:
        per_depth[d] = per_depth.get(d, 0) + 1
    return {"segments": len(windows), "longest_chain": max(depth, default=0),
            "most_segments_at_one_depth": max(per_depth.values(), default=0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tp", type=int, default=None, help="default 8, 4 with --train")
    ap.add_argument("--train", action="store_true", help="the training step, not the forward")
    args = ap.parse_args()
    cfg = llama3.LLAMA31_405B._replace(layers=args.layers)
    tp = args.tp or (4 if args.train else 8)
    case = llama3.make_case(tp, sp=True, train=args.train, cfg=cfg)
    with Recorder() as rec:
        problem = import_jax(case.seq, case.dist, case.args, name="deps")
        res = verify_problem(problem)
    print(json.dumps({"layers": args.layers, "tp": tp, "train": args.train,
                      "verified": res.verified, **dependencies(rec.windows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
