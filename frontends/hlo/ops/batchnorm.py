"""batch-norm-training, batch-norm-inference and batch-norm-grad, expanded into
their definitions (XLA's operation semantics; torch_xla lowers LayerNorm to
them). Statistics are per feature (the `feature_index` dim) over every other
dim, n = the product of the other dims' sizes:

    training:  mu = sum(x) / n, var = sum((x - mu)^2) / n,
               y = (x - mu) * rsqrt(var + eps) * scale + offset   -> (y, mu, var)
    inference: y as above with the given mean and variance        -> y
    grad:      c = sum(dy * (x - mu)) / n / (var + eps),
               dx = scale * rsqrt(var + eps) * (dy - sum(dy) / n - c * (x - mu)),
               dscale = sum(dy * (x - mu)) * rsqrt(var + eps),
               doffset = sum(dy)                                  -> (dx, dscale, doffset)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlverify.frontends.hlo.attributes import ints
from dlverify.frontends.hlo.model import HloComputation, HloInstruction, HloShape
from dlverify.frontends.hlo.ops.registry import Val, handler
from dlverify.ir import SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer


@dataclass(frozen=True)
class _Norm:
    """One batch-norm instruction being expanded: its operand's shape and type,
    the feature dim, epsilon, and where its ops are reported."""

    L: Lowerer
    ins: HloInstruction
    loc: SourceLoc
    shape: tuple[int, ...]
    dtype: str
    feature: int
    epsilon: float

    @property
    def features(self) -> tuple[int, ...]:
        return (self.shape[self.feature],)

    @property
    def others(self) -> tuple[int, ...]:
        return tuple(d for d in range(len(self.shape)) if d != self.feature)

    def op(self, kind: str, ins: list[int], shape: tuple[int, ...], params: dict | None = None,
           dtype: str | None = None) -> int:
        return self.L.emit(kind, ins, shape, dtype or self.dtype, params or {}, self.loc,
                           self.ins.name)

    def full(self, v: int) -> int:
        """A per-feature vector broadcast along every other dim."""
        return self.op("broadcast_in_dim", [v], self.shape, {"broadcast_dimensions": (self.feature,)})

    def total(self, t: int) -> int:
        """The per-feature sum of a full-shape tensor."""
        return self.op("reduce_sum", [t], self.features, {"axes": self.others})

    def per_element(self, total: int) -> int:
        """A per-feature sum divided by the number of elements it sums."""
        n = 1
        for d in self.others:
            n *= self.shape[d]
        return self.op("div", [total, self.L.splat(n, self.features, self.dtype, self.loc,
                                                   self.ins.name)], self.features)

    def mean(self, t: int) -> int:
        return self.per_element(self.total(t))

    def plus_eps(self, var: int) -> int:
        eps = self.L.splat(self.epsilon, self.features, self.dtype, self.loc, self.ins.name)
        return self.op("add", [var, eps], self.features)


def _norm(L: Lowerer, ins: HloInstruction, ops: list[Val], loc: SourceLoc, n_ops: int,
          results: list[str]) -> tuple[_Norm, list[int], list[HloShape]]:
    """Checks operands (operand first, then per-feature vectors, a full-shape one
    named "grad_output") and the declared results ("full" / "feature" each)."""
    if len(ops) != n_ops:
        raise L.err(ins, f"{ins.opcode} takes {n_ops} operands, got {len(ops)}")
    ts = [L.tid(ins, v) for v in ops]
    shape, dtype = L.shape_of(ts[0]), L.dtype_of(ts[0])
    fi = ints(ins.attrs.get("feature_index"))
    if len(fi) != 1 or not 0 <= fi[0] < len(shape):
        raise L.err(ins, f"{ins.opcode} needs feature_index=<d> within the rank-{len(shape)} operand")
    try:
        eps = float((ins.attrs.get("epsilon") or "").strip())
    except ValueError:
        raise L.err(ins, f"{ins.opcode} needs epsilon=<float>") from None
    norm = _Norm(L, ins, loc, shape, dtype, fi[0], eps)
    full_ops = {len(ts) - 1} if ins.opcode == "batch-norm-grad" else set()
    for k, t in enumerate(ts[1:], 1):
        want = shape if k in full_ops else norm.features
        if L.shape_of(t) != want:
            raise L.err(ins, f"{ins.opcode} operand {k} is {L.dtype_of(t)}{list(L.shape_of(t))}, "
                             f"expected {list(want)} (feature dim {fi[0]})")
    shapes = list(ins.shape.elements) if ins.shape.is_tuple else [ins.shape]
    want_shapes = [shape if r == "full" else norm.features for r in results]
    if len(shapes) != len(results) or any(s.is_tuple or s.dims != w
                                          for s, w in zip(shapes, want_shapes)) \
            or ins.shape.is_tuple != (len(results) > 1):
        raise L.err(ins, f"{ins.opcode} of {dtype}{list(shape)} with feature_index={fi[0]} declares "
                         f"the result {ins.shape}")
    return norm, ts, shapes


def _normalise(n: _Norm, x: int, mean: int, var: int, scale: int, offset: int,
               dtype: str) -> int:
    """(x - mean) * rsqrt(var + eps) * scale + offset."""
    centred = n.op("sub", [x, n.full(mean)], n.shape)
    inv = n.op("rsqrt", [n.plus_eps(var)], n.features)
    scaled = n.op("mul", [n.op("mul", [centred, n.full(inv)], n.shape), n.full(scale)], n.shape)
    return n.op("add", [scaled, n.full(offset)], n.shape, dtype=dtype)


@handler("batch-norm-training")
def _training(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
              loc: SourceLoc) -> Val:
    n, (x, scale, offset), res = _norm(L, ins, ops, loc, 3, ["full", "feature", "feature"])
    mu = n.mean(x)
    centred = n.op("sub", [x, n.full(mu)], n.shape)
    var = n.mean(n.op("mul", [centred, centred], n.shape))
    y = _normalise(n, x, mu, var, scale, offset, res[0].dtype)
    return (y, mu, var)


@handler("batch-norm-inference")
def _inference(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
               loc: SourceLoc) -> Val:
    n, (x, scale, offset, mean, var), res = _norm(L, ins, ops, loc, 5, ["full"])
    return _normalise(n, x, mean, var, scale, offset, res[0].dtype)


@handler("batch-norm-grad")
def _grad(L: Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
          loc: SourceLoc) -> Val:
    n, (x, scale, mean, var, dy), res = _norm(L, ins, ops, loc, 5, ["full", "feature", "feature"])
    centred = n.op("sub", [x, n.full(mean)], n.shape)
    var_eps = n.plus_eps(var)
    inv = n.op("rsqrt", [var_eps], n.features)
    dy_centred = n.total(n.op("mul", [dy, centred], n.shape))          # sum(dy * (x - mu))
    c = n.op("div", [n.per_element(dy_centred), var_eps], n.features)
    dy_sum = n.total(dy)
    dy_mean = n.per_element(dy_sum)
    inner = n.op("sub", [n.op("sub", [dy, n.full(dy_mean)], n.shape),
                         n.op("mul", [n.full(c), centred], n.shape)], n.shape)
    gain = n.op("mul", [scale, inv], n.features)
    dx = n.op("mul", [n.full(gain), inner], n.shape, dtype=res[0].dtype)
    dscale = n.op("mul", [dy_centred, inv], n.features, dtype=res[1].dtype)
    return (dx, dscale, dy_sum)
