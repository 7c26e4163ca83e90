"""The blocks of a ``fused_attention`` kernel (``ops/attention.py``), found the same way by every template."""

from __future__ import annotations

from typing import Dict, Optional

from tvm import s_tir, tirx

STAGES = ("attn_online", "attn_bo", "attn_bsum", "attn_p", "attn_bmax", "attn_qk", "attn_kt")
#: present for 16-bit inputs only: the rounded probabilities and V in key blocks (the matmul operands)
LOW_PRECISION_STAGES = ("attn_p16", "attn_vb")


def kernel_stages(sch: s_tir.Schedule, out, stages=STAGES,
                  what: str = "tfx.attention: not a fused_attention kernel") -> Dict[str, s_tir.schedule.SBlockRV]:
    """The kernel's blocks by name, found through the producer graph (robust to function renaming); ``stages``
    must all be there, else ``what`` and the missing ones."""
    found, todo = {}, [out]
    while todo:
        blk = todo.pop()
        for prod in sch.get_producers(blk):
            name = sch.get(prod).name_hint
            if name not in found:
                found[name] = prod
                todo.append(prod)
    missing = [n for n in stages if n not in found]
    if missing:
        raise ValueError(f"{what} (missing blocks {missing})")
    return found


def output_loops_bhsd(sch, out):
    """Loops of the output block in (b, h, s, d) order, whatever the output layout."""
    block = sch.get(out)
    loops = sch.get_loops(out)
    ivars = [iv.var for iv in block.iter_vars]
    # the output reads the running sum at [b, h, i, d]: its index vars name the block vars in BHSD order
    region = [r for r in block.reads if str(r.source.name).startswith("attn_online")][0].region
    order = [next(n for n, v in enumerate(ivars) if v.same_as(r.min)) for r in region]
    return [loops[n] for n in order]


def inline_low_precision_stages(sch: s_tir.Schedule, stages: Dict[str, s_tir.schedule.SBlockRV]) -> None:
    """Templates without tensor cores multiply 16-bit operands where they are read: fold the copies back."""
    for name in LOW_PRECISION_STAGES:
        if name in stages:
            sch.compute_inline(stages.pop(name))


def symbolic_rows_reason(sch: s_tir.Schedule, out) -> Optional[str]:
    """Why a template cannot take this kernel's symbolic dims, or None. Batch and key count may be symbolic
    (a parallel loop; key blocks padded by the operator); query rows only when the operator padded them to
    tiles (its ``attn_rows`` stage); heads and head dim are static by the operator's contract."""
    if sch.get(out).name_hint == "attn_rows":
        return None
    _, _, rows, _ = output_loops_bhsd(sch, out)
    extent = sch.get(rows).extent
    return None if isinstance(extent, tirx.IntImm) else f"query rows {extent} are symbolic and not padded to tiles"


def pad_symbolic_queries(call, tile: int):
    """The ``fused_attention`` call with its symbolic query rows padded to ``tile`` (``query_block``), or None
    when there is nothing to do (static rows, already padded, another operator)."""
    if call.op != "fused_attention" or call.params.get("query_block") is not None:
        return None
    rows = call.inputs["q"].ty.shape[2 if call.params.get("q_layout", "BSHD") == "BHSD" else 1]
    if isinstance(rows, tirx.IntImm):
        return None
    return call.replace(params=dict(call.params, query_block=int(tile)))


def separate_head_ranges(call):
    """The ``fused_attention`` call with each operand that is a head range of a larger tensor (a fused QKV
    projection read in place: ``transform/attention_qkv_heads.py``) sliced out to a tensor of its own, and the
    head-range parameters dropped; None when it reads no head ranges. For a template that tiles each operand
    as a whole ``[B, S, H, D]`` tensor."""
    from tvm import relax

    from ..ops.attention import HEAD_RANGE_PARAMS, head_axis, head_ranges

    params = call.params
    if not any(params.get(p) for p in HEAD_RANGE_PARAMS):
        return None
    axes = {n: head_axis(params.get(f"{n}_layout", "BSHD")) for n in "qkv"}
    extents = {n: int(call.inputs[n].ty.shape[axes[n]]) for n in "qkv"}
    inputs = {n: relax.op.strided_slice(call.inputs[n], axes=[axes[n]], begin=[start], end=[start + count])
              for n, (start, count) in head_ranges(params, extents).items() if start or count != extents[n]}
    kept = {k: v for k, v in params.items() if k not in HEAD_RANGE_PARAMS}
    return call.replace(inputs=inputs, params=kept)
