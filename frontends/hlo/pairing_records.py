"""What the pairing of two HLO modules decides (frontends/hlo/pairing.py): the
policy for parameters without a spec entry, each parameter pair, and the record
`dlverify spec` and dlverify/trial.py read."""
from __future__ import annotations

from dataclasses import dataclass, field

from dlverify.frontends.hlo.lower import HloParam
from dlverify.relations import BlockRelation
from dlverify.spec import ParamSpec


@dataclass(frozen=True)
class ParamPolicy:
    """How a parameter without a spec entry gets its relation."""

    # Fall back to the shapes when the sharding annotation gives no even block.
    infer_from_shapes: bool = True
    # The sharding annotation is read from a file (an assumption, listed), not
    # given by the caller (jax.jit's in_shardings are the user's own statement).
    sharding_is_assumption: bool = True


@dataclass(frozen=True)
class ParamPair:
    """Sequential parameter `seq` and its distributed counterpart (None: the
    distributed module dropped it as unused)."""

    seq: HloParam
    dist: HloParam | None
    evidence: str = ""     # why these two pair, when the numbers alone did not say


@dataclass(frozen=True)
class ParamRecord:
    """How sequential parameter `seq` was paired and related, for `dlverify spec`:
    the spec entry that states it and the evidence (empty when the spec or the
    caller stated it)."""

    seq: int
    dist: int | None
    entry: ParamSpec | None     # None: no spec entry can state the relation
    evidence: str = ""


@dataclass
class PairingRecord:
    """What `pair_modules` decided, for `dlverify spec`: where the rank count came
    from (empty when stated) and one ParamRecord per sequential parameter."""

    rank_evidence: str = ""
    params: list[ParamRecord] = field(default_factory=list)
    # The candidate relations of each sequential parameter that had several (by
    # number, labels in order), for dlverify/trial.py.
    candidates: dict[int, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """How one parameter pair is related: a block relation (with `reshaped`, held
    by the distributed parameter reshaped row-major to its declared shape), or
    (relation None) a segmented split of `segment_dim` into `segments`, or
    rank-0-only, or a padded split; all but a plain block relation are written
    into the graphs as ops (frontends/hlo/boundary.py)."""

    relation: BlockRelation | None
    segment_dim: int | None = None
    segments: tuple[int, ...] | None = None
    rank0_only: bool = False
    pad: str | None = None   # a padded split of `segment_dim`: "zero" or "any" (spec.PAD_FORMS)
    reshaped: bool = False
    evidence: str = ""     # why, when neither the spec nor the caller stated it
    assumption: str = ""   # what Problem.assumptions lists when it is chosen (empty: stated)
    label: str = ""        # the candidate in a few words (dlverify/trial.py's notes)


__all__ = ["Decision", "PairingRecord", "ParamPair", "ParamPolicy", "ParamRecord"]
