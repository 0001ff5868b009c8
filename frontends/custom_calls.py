"""The custom-call registry of the HLO frontend and its expansions into IR ops.

The registry (a TOML file, built in: dlverify/custom_calls.toml) maps a
`custom_call_target` to an expansion name and its options. Each expansion
emits ordinary IR ops for one call and returns the result tensor plus the
assumption it stands for; the frontend lists every assumption in
`Problem.assumptions`. Users add targets with their own TOML file
(`load_registry(path)` merges it over the built-in one).
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from dlverify.errors import InputError
from dlverify.ir import ELEMENTWISE_LINEAR_UNARY, ELEMENTWISE_NONLINEAR_UNARY, SourceLoc

if TYPE_CHECKING:
    from dlverify.frontends.hlo.lower import Lowerer
    from dlverify.frontends.hlo.model import HloInstruction

BUILTIN_NAME = "dlverify/custom_calls.toml"


@dataclass(frozen=True)
class CustomCallSpec:
    target: str
    expand: str
    operands: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    source: str = BUILTIN_NAME   # the registry file, as shown in assumptions
    line: int = 0


Expansion = Callable[["CustomCallSpec", "Lowerer", "HloInstruction", list[Any], SourceLoc],
                     tuple[int, str]]
EXPANSIONS: dict[str, Expansion] = {}
_OPTIONS = {"expand", "operands", "doc", "dim", "kind"}


def expansion(name: str) -> Callable[[Expansion], Expansion]:
    def deco(fn: Expansion) -> Expansion:
        EXPANSIONS[name] = fn
        return fn
    return deco


def _key_line(text: str, key: str) -> int:
    pat = re.compile(r'^\s*(\[\s*)?"?' + re.escape(key) + r'"?\s*(\]|=)')
    for i, line in enumerate(text.splitlines(), 1):
        if pat.match(line):
            return i
    return 0


def parse_registry(text: str, source: str) -> dict[str, CustomCallSpec]:
    """Parse registry TOML text; `source` names the file in errors and assumptions."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise InputError(f"custom-call registry: {e}", source, int(m.group(1)) if m else 0) from None
    out: dict[str, CustomCallSpec] = {}
    for target, entry in data.items():
        line = _key_line(text, target)
        if not isinstance(entry, dict):
            raise InputError(f"custom call {target}: expected a table such as "
                             f"{{ expand = \"identity\" }}", source, line)
        unknown = set(entry) - _OPTIONS
        if unknown:
            raise InputError(f"custom call {target}: unknown field(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(_OPTIONS))})", source, line)
        exp = entry.get("expand")
        if exp not in EXPANSIONS:
            raise InputError(f"custom call {target}: expand = {exp!r} is not one of "
                             f"{', '.join(sorted(EXPANSIONS))}", source, line)
        operands = entry.get("operands", [])
        if not isinstance(operands, list) or not all(isinstance(o, str) for o in operands):
            raise InputError(f"custom call {target}: operands must be a list of names", source, line)
        opts = {k: v for k, v in entry.items() if k not in ("expand", "operands")}
        if exp in ("rms_norm", "softmax", "softmax_backward"):
            dim = opts.get("dim")
            if not (isinstance(dim, int) and not isinstance(dim, bool)) and dim != "backend_config":
                raise InputError(f"custom call {target}: {exp} needs dim = <int> or "
                                 f"\"backend_config\"", source, line)
            if exp == "softmax_backward" and len(operands) != 2:
                raise InputError(f"custom call {target}: softmax_backward takes 2 operands "
                                 f"(grad_output, output)", source, line)
            if exp == "rms_norm" and len(operands) != 3:
                raise InputError(f"custom call {target}: rms_norm takes 3 operands (input, weight, "
                                 f"epsilon)", source, line)
        if exp == "unary":
            kind = opts.get("kind")
            if kind not in ELEMENTWISE_NONLINEAR_UNARY | ELEMENTWISE_LINEAR_UNARY:
                raise InputError(f"custom call {target}: unary needs kind = an elementwise unary IR "
                                 f"op, got {kind!r}", source, line)
        out[target] = CustomCallSpec(target, exp, tuple(operands), opts, source, line)
    return out


@lru_cache(maxsize=1)
def _builtin() -> dict[str, CustomCallSpec]:
    text = resources.files("dlverify").joinpath("custom_calls.toml").read_text(encoding="utf-8")
    return parse_registry(text, BUILTIN_NAME)


def builtin_registry() -> dict[str, CustomCallSpec]:
    """The registry shipped as dlverify/custom_calls.toml."""
    return dict(_builtin())


def load_registry(path: str | Path | None = None) -> dict[str, CustomCallSpec]:
    """The built-in registry, with the entries of the TOML file `path` (if any)
    added or overriding."""
    reg = builtin_registry()
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise InputError(f"cannot read custom-call registry: {e.strerror}", str(path)) from None
        reg.update(parse_registry(text, str(path)))
    return reg


def expand(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
           loc: SourceLoc) -> tuple[int, str]:
    """Emit the ops of one custom call; return (result tensor, assumption text)."""
    if spec.operands and len(ops) != len(spec.operands):
        raise L.err(ins, f"custom call {spec.target} has {len(ops)} operands but the registry "
                         f"({spec.source}) declares {len(spec.operands)}: "
                         f"{', '.join(spec.operands)}")
    return EXPANSIONS[spec.expand](spec, L, ins, ops, loc)


def _names(spec: CustomCallSpec, n: int) -> str:
    return ", ".join(spec.operands) if spec.operands else ", ".join(f"x{i}" for i in range(n))


def _one_operand_same_shape(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction",
                            ops: list[Any], what: str) -> tuple[int, Any]:
    """The single operand of an elementwise custom call, and the (equal) output shape."""
    if len(ops) != 1:
        raise L.err(ins, f"custom call {spec.target} ({what}) needs exactly one operand")
    t = L.tid(ins, ops[0])
    out = L.array_shape(ins)
    if L.shape_of(t) != out.dims:
        raise L.err(ins, f"custom call {spec.target} ({what}) changes the shape "
                         f"{L.shape_of(t)} -> {out.dims}")
    return t, out


@expansion("identity")
def _identity(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
              loc: SourceLoc) -> tuple[int, str]:
    t, _ = _one_operand_same_shape(spec, L, ins, ops, "identity")
    return t, f"custom call {spec.target} assumed to be the identity ({spec.source})"


@expansion("unary")
def _unary(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
           loc: SourceLoc) -> tuple[int, str]:
    t, out = _one_operand_same_shape(spec, L, ins, ops, "unary")
    kind = spec.options["kind"]
    r = L.emit(kind, [t], out.dims, out.dtype, {}, loc, ins.name)
    return r, f"custom call {spec.target} assumed to compute {kind}({_names(spec, 1)}) ({spec.source})"


@expansion("silu")
def _silu(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
          loc: SourceLoc) -> tuple[int, str]:
    t, out = _one_operand_same_shape(spec, L, ins, ops, "silu")
    s = L.emit("logistic", [t], out.dims, L.dtype_of(t), {}, loc, ins.name)
    r = L.emit("mul", [t, s], out.dims, out.dtype, {}, loc, ins.name)
    return r, (f"custom call {spec.target} assumed to compute silu({_names(spec, 1)}) = "
               f"x * logistic(x) ({spec.source})")


def _normalised_dim(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", rank: int) -> int:
    """The `dim` option: an integer, or the call's backend_config string
    (torch-neuronx writes str(dim) there); negative counts from the end."""
    dim_opt = spec.options["dim"]
    if dim_opt == "backend_config":
        bc = (ins.attrs.get("backend_config") or "").strip().strip('"')
        if not re.fullmatch(r"-?\d+", bc):
            raise L.err(ins, f"custom call {spec.target}: backend_config {bc!r} is not the "
                             f"normalised dim (registry {spec.source} says dim = \"backend_config\")")
        dim = int(bc)
    else:
        dim = int(dim_opt)
    if dim < 0:
        dim += rank
    if not 0 <= dim < rank:
        raise L.err(ins, f"custom call {spec.target}: dim {dim} outside the rank-{rank} input")
    return dim


def _normal_cdf(L: "Lowerer", x: int, loc: SourceLoc, name: str) -> int:
    """Phi(x) = (1 + erf(x / sqrt(2))) / 2, with sqrt(2) computed (exact over the reals)."""
    xs, dt = L.shape_of(x), L.dtype_of(x)
    root2 = L.emit("sqrt", [L.splat(2.0, xs, dt, loc, name)], xs, dt, {}, loc, name)
    e = L.emit("erf", [L.emit("div", [x, root2], xs, dt, {}, loc, name)], xs, dt, {}, loc, name)
    one_e = L.emit("add", [L.splat(1.0, xs, dt, loc, name), e], xs, dt, {}, loc, name)
    return L.emit("mul", [one_e, L.splat(0.5, xs, dt, loc, name)], xs, dt, {}, loc, name)


@expansion("gelu")
def _gelu(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
          loc: SourceLoc) -> tuple[int, str]:
    """The exact (erf) GELU: x * Phi(x)."""
    x, out = _one_operand_same_shape(spec, L, ins, ops, "gelu")
    y = L.emit("mul", [x, _normal_cdf(L, x, loc, ins.name)], out.dims, out.dtype, {}, loc, ins.name)
    return y, (f"custom call {spec.target} assumed to compute the exact GELU "
               f"x * (1 + erf(x / sqrt(2))) / 2 of {_names(spec, 1)} ({spec.source})")


@expansion("gelu_backward")
def _gelu_backward(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
                   loc: SourceLoc) -> tuple[int, str]:
    """The derivative of the exact GELU: Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi)."""
    x, out = _one_operand_same_shape(spec, L, ins, ops, "gelu_backward")
    xs, dt, name = out.dims, L.dtype_of(x), ins.name
    sq = L.emit("mul", [x, x], xs, dt, {}, loc, name)
    half_sq = L.emit("mul", [sq, L.splat(-0.5, xs, dt, loc, name)], xs, dt, {}, loc, name)
    pdf = L.emit("mul", [L.emit("exp", [half_sq], xs, dt, {}, loc, name),
                         L.splat(1.0 / np.sqrt(2.0 * np.pi), xs, dt, loc, name)], xs, dt, {},
                 loc, name)
    xpdf = L.emit("mul", [x, pdf], xs, dt, {}, loc, name)
    y = L.emit("add", [_normal_cdf(L, x, loc, name), xpdf], xs, out.dtype, {}, loc, name)
    return y, (f"custom call {spec.target} assumed to compute the derivative of the exact GELU, "
               f"Phi(x) + x * exp(-x^2/2) / sqrt(2 pi) of {_names(spec, 1)} ({spec.source})")


@expansion("softmax")
def _softmax(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
             loc: SourceLoc) -> tuple[int, str]:
    """exp(x - max) / sum(exp(x - max)) over dim, max and sum broadcast back along it."""
    x, out = _one_operand_same_shape(spec, L, ins, ops, "softmax")
    xs, dt, name = out.dims, L.dtype_of(x), ins.name
    dim = _normalised_dim(spec, L, ins, len(xs))
    rest = tuple(s for i, s in enumerate(xs) if i != dim)
    keep = {"broadcast_dimensions": tuple(i for i in range(len(xs)) if i != dim)}
    mx = L.emit("reduce_max", [x], rest, dt, {"axes": (dim,)}, loc, name)
    shifted = L.emit("sub", [x, L.emit("broadcast_in_dim", [mx], xs, dt, keep, loc, name)], xs, dt,
                     {}, loc, name)
    e = L.emit("exp", [shifted], xs, dt, {}, loc, name)
    total = L.emit("reduce_sum", [e], rest, dt, {"axes": (dim,)}, loc, name)
    y = L.emit("div", [e, L.emit("broadcast_in_dim", [total], xs, dt, keep, loc, name)], xs,
               out.dtype, {}, loc, name)
    return y, (f"custom call {spec.target} assumed to compute softmax({_names(spec, 1)}) = "
               f"exp(x - max) / sum(exp(x - max)) over dim {dim} ({spec.source})")


@expansion("softmax_backward")
def _softmax_backward(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
                      loc: SourceLoc) -> tuple[int, str]:
    """The gradient of softmax through its output y: dx = y * (dy - sum(dy * y over dim)),
    the sum broadcast back along dim (the vjp of y = softmax(x) at cotangent dy)."""
    if len(ops) != 2:
        raise L.err(ins, f"custom call {spec.target} (softmax_backward) needs (grad_output, output)")
    dy, y = (L.tid(ins, v) for v in ops)
    out = L.array_shape(ins)
    xs, dt, name = out.dims, L.dtype_of(y), ins.name
    if L.shape_of(dy) != xs or L.shape_of(y) != xs:
        raise L.err(ins, f"custom call {spec.target} (softmax_backward): operand shapes "
                         f"{L.shape_of(dy)}, {L.shape_of(y)} and the result shape {xs} differ")
    dim = _normalised_dim(spec, L, ins, len(xs))
    rest = tuple(s for i, s in enumerate(xs) if i != dim)
    keep = {"broadcast_dimensions": tuple(i for i in range(len(xs)) if i != dim)}
    prod = L.emit("mul", [dy, y], xs, dt, {}, loc, name)
    total = L.emit("reduce_sum", [prod], rest, dt, {"axes": (dim,)}, loc, name)
    centred = L.emit("sub", [dy, L.emit("broadcast_in_dim", [total], xs, dt, keep, loc, name)], xs,
                     dt, {}, loc, name)
    dx = L.emit("mul", [y, centred], xs, out.dtype, {}, loc, name)
    return dx, (f"custom call {spec.target} assumed to compute the softmax gradient "
                f"y * (dy - sum(dy * y)) over dim {dim} of ({_names(spec, 2)}) = (dy, y) "
                f"({spec.source})")


@expansion("rms_norm")
def _rms_norm(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
              loc: SourceLoc) -> tuple[int, str]:
    """y = x * rsqrt(sum(x * x over dim) / n + eps) * w, w broadcast along dim."""
    if len(ops) != 3:
        raise L.err(ins, f"custom call {spec.target} (rms_norm) needs (input, weight, epsilon)")
    x, w, eps = (L.tid(ins, v) for v in ops)
    xs, dt = L.shape_of(x), L.dtype_of(x)
    out = L.array_shape(ins)
    dim = _normalised_dim(spec, L, ins, len(xs))
    if out.dims != xs:
        raise L.err(ins, f"custom call {spec.target}: result shape {out.dims} differs from the "
                         f"input shape {xs}")
    if L.shape_of(w) != (xs[dim],):
        raise L.err(ins, f"custom call {spec.target}: weight shape {L.shape_of(w)} is not "
                         f"({xs[dim]},), the size of dim {dim}")
    if L.shape_of(eps) != ():
        raise L.err(ins, f"custom call {spec.target}: epsilon must be a scalar")
    rest = tuple(s for i, s in enumerate(xs) if i != dim)
    keep = tuple(i for i in range(len(xs)) if i != dim)
    name = ins.name
    sq = L.emit("mul", [x, x], xs, dt, {}, loc, name)
    ss = L.emit("reduce_sum", [sq], rest, dt, {"axes": (dim,)}, loc, name)
    nval = np.array(xs[dim], dtype=_np(dt))
    n = L.b.constant(nval, (), dt, loc, name)
    L.known[n] = nval
    nb = L.emit("broadcast_in_dim", [n], rest, dt, {"broadcast_dimensions": ()}, loc, name)
    mean = L.emit("div", [ss, nb], rest, dt, {}, loc, name)
    eb = L.emit("broadcast_in_dim", [eps], rest, L.dtype_of(eps), {"broadcast_dimensions": ()},
                loc, name)
    v = L.emit("add", [mean, eb], rest, dt, {}, loc, name)
    r = L.emit("rsqrt", [v], rest, dt, {}, loc, name)
    rb = L.emit("broadcast_in_dim", [r], xs, dt, {"broadcast_dimensions": keep}, loc, name)
    xn = L.emit("mul", [x, rb], xs, dt, {}, loc, name)
    wb = L.emit("broadcast_in_dim", [w], xs, L.dtype_of(w), {"broadcast_dimensions": (dim,)}, loc, name)
    y = L.emit("mul", [xn, wb], xs, out.dtype, {}, loc, name)
    return y, (f"custom call {spec.target} assumed to compute rms_norm({_names(spec, 3)}) over dim "
               f"{dim} ({spec.source})")


@expansion("top_k")
def _top_k(spec: CustomCallSpec, L: "Lowerer", ins: "HloInstruction", ops: list[Any],
           loc: SourceLoc) -> tuple[Any, str]:
    """XLA's TopK custom call (TopkRewriter, e.g. lax.top_k on CPU): (values,
    indices) of the k largest along the last dim, k from the result shape. Its
    `called_computations` comparator must order like a > b on the values, i.e.
    the k largest (the CPU runtime applies XLA's total order itself)."""
    from dlverify.frontends.hlo.comparator import comparator_order
    from dlverify.frontends.hlo.ops.sorting import emit_top_k
    if len(ops) != 1:
        raise L.err(ins, f"custom call {spec.target} (top_k) needs exactly one operand")
    x = L.tid(ins, ops[0])
    names = [n.strip().lstrip("%") for n in (ins.attrs.get("called_computations") or "")
             .strip().strip("{}").split(",") if n.strip()]
    if len(names) != 1 or names[0] not in L.m.computations:
        raise L.err(ins, f"custom call {spec.target} (top_k) needs one comparator in "
                         f"called_computations")
    res = ins.shape.elements if ins.shape.is_tuple else ()
    if len(res) != 2 or not res[0].dims:
        raise L.err(ins, f"custom call {spec.target} (top_k) declares the result {ins.shape}, "
                         f"expected a (values, indices) tuple")
    order = comparator_order(L, ins, L.m.computations[names[0]], [L.dtype_of(x), res[1].dtype])
    if not order.descending:
        raise L.unknown(ins, f"custom call {spec.target} (top_k) with a comparator that orders "
                             f"ascending (the k smallest) is not supported")
    # The comparator's notes on -0 and NaN concern the IR's sort; top_k orders
    # like XLA's TopK runtime (a total order: +0 above -0, NaN largest).
    k = res[0].dims[-1]
    out = emit_top_k(L, ins, x, k, loc)
    return out, (f"custom call {spec.target} assumed to compute lax.top_k({_names(spec, 1)}, k={k}): "
                 f"the k largest along the last dim, equal values by lower index ({spec.source})")


def _np(dtype: str) -> Any:
    from dlverify.frontends.hlo.model import np_dtype
    return np_dtype(dtype)
