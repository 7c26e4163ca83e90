"""fused_rope: rotary position embeddings, ``x·cos + rot(x)·sin``, as one elementwise kernel.

``x`` is 4-D with its axes named by ``layout`` (``"BHSD"`` or ``"BSHD"``: batch, heads, positions, head dim);
``cos`` and ``sin`` are (1 | B, 1 | S, D), the tables the model gathered or computed for its positions.
``rot`` pairs each head-dim element with a partner and negates the first of each pair:

* ``"half"`` (rotate-half, LLaMA / GPT-NeoX): ``rot(x) = [-x[D/2:], x[:D/2]]``;
* ``"interleaved"`` (GPT-J / Meta's complex form): ``rot(x)[2i] = -x[2i+1]``, ``rot(x)[2i+1] = x[2i]``.

The operator exists so that a rotation the attention rule cannot absorb still runs as one kernel instead of
six; ``fused_attention`` applies the same :func:`rotary_read` where it reads Q and K (see there).
"""

from __future__ import annotations

from tvm import te, tirx

from .registry import register_op

STYLES = ("half", "interleaved")
LAYOUTS = ("BHSD", "BSHD")
ACC = "float32"


def rotary_read(x, cos, sin, style: str, dim: int):
    """``x(b, h, pos, d)`` (a function of indices) read rotated, in fp32: ``x·cos + rot(x)·sin``.

    The partner of ``d`` comes from index arithmetic that stays in bounds for every ``d`` (a Select between
    two reads would evaluate an out-of-range one), the sign of ``rot`` from a Select on ``d``."""
    half = dim // 2

    def table(t, b, pos, d):
        return t[0 if _is_one(t.shape[0]) else b, 0 if _is_one(t.shape[1]) else pos, d].astype(ACC)

    def read(b, h, pos, d):
        if style == "half":
            partner, negated = (d + half) % dim, d < half
        else:
            partner, negated = d + 1 - 2 * (d % 2), d % 2 == 0
        other = x(b, h, pos, partner).astype(ACC)
        return (x(b, h, pos, d).astype(ACC) * table(cos, b, pos, d)
                + tirx.Select(negated, -other, other) * table(sin, b, pos, d))

    return read


def check_rope_tables(op: str, name: str, style: str, cos, sin, batch, length, dim: int) -> None:
    """The ``{name}_rope`` style is known and its tables are (1 | batch, 1 | length, dim)."""
    if style not in ("none",) + STYLES:
        raise ValueError(f"{op}: {name}_rope must be one of {('none',) + STYLES}, got '{style}'")
    if style == "none":
        if cos is not None or sin is not None:
            raise ValueError(f"{op}: {name}_cos/{name}_sin given without {name}_rope")
        return
    if cos is None or sin is None:
        raise ValueError(f"{op}: {name}_rope='{style}' needs {name}_cos and {name}_sin")
    if dim % 2:
        raise ValueError(f"{op}: rotary embeddings need an even head dim, got {dim}")
    for t in (cos, sin):
        ok = (len(t.shape) == 3 and _fits(t.shape[0], batch) and _fits(t.shape[1], length)
              and _is_static(t.shape[2]) and int(t.shape[2]) == dim)
        if not ok:
            raise ValueError(f"{op}: {name}_cos/{name}_sin of shape {list(t.shape)} is not "
                             f"(1 | {batch}, 1 | {length}, {dim})")


def _is_static(extent) -> bool:
    return isinstance(extent, (int, tirx.IntImm))


def _is_one(extent) -> bool:
    return _is_static(extent) and int(extent) == 1


def _fits(extent, want) -> bool:
    """``extent`` is 1 or the same dimension as ``want`` (static or symbolic)."""
    if _is_one(extent):
        return True
    if _is_static(extent) and _is_static(want):
        return int(extent) == int(want)
    if _is_static(extent) or _is_static(want):
        return False
    # a length computed from a dim (a conv's output, ``seq // 10 - 1``) reaches the table and x as two equal
    # expressions, not one object
    from tvm import sym

    return extent.same_as(want) or sym.Analyzer().can_prove_equal(extent, want)


@register_op("fused_rope", inputs=("x", "cos", "sin"))
def fused_rope(x, cos, sin, *, style: str, layout: str = "BHSD"):
    if style not in STYLES:
        raise ValueError(f"fused_rope: style must be one of {STYLES}, got '{style}'")
    if layout not in LAYOUTS or len(x.shape) != 4:
        raise ValueError(f"fused_rope: x must be 4-D in one of {LAYOUTS}, got {list(x.shape)} '{layout}'")
    b, h, s, d = (0, 1, 2, 3) if layout == "BHSD" else (0, 2, 1, 3)
    dim = int(x.shape[d])
    check_rope_tables("fused_rope", "x", style, cos, sin, x.shape[b], x.shape[s], dim)

    def at(ib, ih, ipos, idim):
        ix = [None] * 4
        ix[b], ix[h], ix[s], ix[d] = ib, ih, ipos, idim
        return x[tuple(ix)]

    rotated = rotary_read(at, cos, sin, style, dim)

    def compute(*ix):
        return rotated(ix[b], ix[h], ix[s], ix[d]).astype(x.dtype)

    return te.compute(x.shape, compute, name="rope")
