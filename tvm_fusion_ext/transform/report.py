"""FusionReport: what fired where, and every near miss with the reason it was refused.

Passes report into every active collector, so a user can wrap any pipeline:

    with FusionReport.collect() as report:
        mod = SemanticFusion()(mod)
    print(report.summary())
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass, field

#: fused kinds always present in ``FusionReport.fused`` (the CLI's JSON contract)
FUSED_KINDS = ("dense", "attention", "layernorm", "qkv", "rmsnorm", "gated_mlp", "rope")
#: the report bucket of RemovePadding (a graph-wide rewrite, counted apart from the fused operators)
PADDING_KIND = "padding_removed"
#: the bucket of each attention RemovePadding runs packed (varlen) instead of around a scatter/gather
VARLEN_KIND = "varlen_attention"
#: the bucket of each attention that reads its Q/K/V heads from one projection output (:mod:`.attention_qkv_heads`)
HEADS_IN_PLACE_KIND = "attention_heads_in_place"

_active = threading.local()


class ExpectedRefusal(str):
    """A refusal reason that says the graph is right as it is: the rule matched, and the node it would remove is
    needed (e.g. the NaN guard after a softmax whose input may hold -inf). A rule's ``check`` returns one instead
    of a plain ``str``; the report lists it apart from the near misses, which are what a user may want to fix."""


@dataclass
class FusionEvent:
    rule: str  # e.g. "FuseMatmulBiasActivation"
    kind: str  # report bucket: one of FUSED_KINDS, or canonical
    function: str  # relax function name
    at: str  # name of the bound variable the rule was anchored at
    detail: str = ""  # accepted: what was built ("gelu, bias"); refused: the reason
    expected: bool = False  # refused: the refusal is correct for this graph (an :class:`ExpectedRefusal`)

    def to_dict(self, detail_key: str = "detail") -> dict:
        d = {"rule": self.rule, "kind": self.kind, "function": self.function, "at": self.at,
             detail_key: self.detail}
        if detail_key == "reason":
            d["expected"] = self.expected
        return d


@dataclass
class FusionReport:
    applied: list = field(default_factory=list)
    refused: list = field(default_factory=list)

    # -- collection ---------------------------------------------------------------------------------
    @classmethod
    @contextlib.contextmanager
    def collect(cls):
        report = cls()
        stack = _stack()
        stack.append(report)
        try:
            yield report
        finally:
            stack.remove(report)

    @property
    def fused(self) -> dict:
        counts = {k: 0 for k in FUSED_KINDS}
        for e in self.applied:
            if e.kind in counts:
                counts[e.kind] += 1
        return counts

    @property
    def canonicalized(self) -> dict:
        counts: dict = {}
        for e in self.applied:
            if e.kind == "canonical":
                counts[e.rule] = counts.get(e.rule, 0) + 1
        return counts

    @property
    def padding_removed(self) -> int:
        """Functions whose token-wise operators run on the valid tokens only (:mod:`.padding`)."""
        return sum(1 for e in self.applied if e.kind == PADDING_KIND)

    @property
    def varlen_attention(self) -> int:
        """Fused attentions that run on the packed tokens, per sequence (:mod:`.padding`)."""
        return sum(1 for e in self.applied if e.kind == VARLEN_KIND)

    @property
    def attention_heads_in_place(self) -> int:
        """Fused attentions reading Q/K/V as head ranges of the tensor they were split from (no split copy)."""
        return sum(1 for e in self.applied if e.kind == HEADS_IN_PLACE_KIND)

    @property
    def near_misses(self) -> list:
        """Refusals worth a look: the rule matched and a check refused it (not an :class:`ExpectedRefusal`)."""
        return [e for e in self.refused if not e.expected]

    @property
    def expected_refusals(self) -> list:
        """Refusals that are correct for this graph (the matched node is needed), listed apart from near misses."""
        return [e for e in self.refused if e.expected]

    def count(self, rule: str) -> int:
        return sum(1 for e in self.applied if e.rule == rule)

    # -- output -------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "fused": self.fused,
            "canonicalized": self.canonicalized,
            "padding_removed": self.padding_removed,
            "varlen_attention": self.varlen_attention,
            "attention_heads_in_place": self.attention_heads_in_place,
            "applied": [e.to_dict() for e in self.applied],
            "refused": [e.to_dict("reason") for e in self.refused],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self, list_expected: bool = True) -> str:
        """The report as text. ``list_expected=False`` (``bench``, ``demo``) counts the expected refusals in one
        line instead of listing them; ``fuse`` lists everything."""
        lines = ["Fused operators:"]
        for k, v in self.fused.items():
            lines.append(f"  {k:<10} {v}")
        lines.append(f"Padding removed: {'yes' if self.padding_removed else 'no'}")
        if self.padding_removed:
            lines.append(f"Packed (varlen) attentions: {self.varlen_attention}")
        if self.attention_heads_in_place:
            lines.append(f"Attentions reading Q/K/V heads in place (no split copy): {self.attention_heads_in_place}")
        if self.canonicalized:
            lines.append("Canonicalised exporter idioms:")
            for k, v in sorted(self.canonicalized.items()):
                lines.append(f"  {k:<28} {v}")
        if self.near_misses:
            lines.append(f"Near misses ({len(self.near_misses)}):")
            for e in self.near_misses:
                lines.append(f"  {e.rule} at {e.function}:{e.at}: {e.detail}")
        else:
            lines.append("Near misses: none")
        expected = self.expected_refusals
        if expected and list_expected:
            lines.append(f"Left in place on purpose ({len(expected)}; the graph needs them):")
            for e in expected:
                lines.append(f"  {e.rule} at {e.function}:{e.at}: {e.detail}")
        elif expected:
            by_rule: dict = {}
            for e in expected:
                by_rule[e.rule] = by_rule.get(e.rule, 0) + 1
            rules = ", ".join(f"{r} {n}" for r, n in sorted(by_rule.items()))
            lines.append(f"Left in place on purpose: {len(expected)} ({rules}; the graph needs them, "
                         f"`tvm-fusion fuse` lists why)")
        return "\n".join(lines)


def _stack() -> list:
    if not hasattr(_active, "stack"):
        _active.stack = []
    return _active.stack


def record_applied(event: FusionEvent) -> None:
    for r in _stack():
        r.applied.append(event)


def record_refused(event: FusionEvent) -> None:
    for r in _stack():
        r.refused.append(event)
