"""Image ops: SpaceToDepth's ``CRD`` mode, Resize to sizes computed from the input's shape, and
NonMaxSuppression refusing thresholds given at run time (the stock converter silently substitutes defaults)."""

from __future__ import annotations

from typing import Dict

import numpy as np

from ..errors import Unsupported
from .common import Fixed, int_elements


def converters() -> Dict[str, type]:
    """``{op name: converter class}`` of this family, to lay over TVM's converter map."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import onnx_frontend as of

    class SpaceToDepth(Fixed, of.SpaceToDepth):
        """``mode="CRD"`` (opset 25+; the stock converter always uses ``DCR``)."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            mode = attr.get("mode", b"DCR")
            mode = mode.decode() if isinstance(mode, bytes) else mode
            if mode == "DCR":
                return stock(bb, inputs, attr, params)
            if mode != "CRD":
                raise Unsupported(f"mode {mode!r}")
            bs = int(attr["blocksize"])
            b, c, h, w = inputs[0].ty.shape.values
            x = relax.op.reshape(inputs[0], (b, c, h // bs, bs, w // bs, bs))
            x = relax.op.permute_dims(x, [0, 1, 3, 5, 2, 4])
            return relax.op.reshape(x, (b, c * bs * bs, h // bs, w // bs))

    class NonMaxSuppression(Fixed, of.NonMaxSuppression):
        """Refuses thresholds and box counts computed at run time: the stock converter silently replaces them by
        defaults (0 boxes per class, IoU 0.5, score 0), a wrong answer."""

        _NAMES = {2: "max_output_boxes_per_class", 3: "iou_threshold", 4: "score_threshold"}

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            for i, name in cls._NAMES.items():
                if len(inputs) > i and inputs[i] is not None and not isinstance(inputs[i], tvm.ir.GenericConst):
                    raise Unsupported(f"input {name} must be a constant (an initializer), not computed at run time")
            return stock(bb, inputs, attr, params)

    class Resize(Fixed, of.Resize):
        """Output sizes computed from the input's shape: MobileViT resizes its feature map to ``ceil(h / p) · p``
        with ``sizes = Concat(Shape(x)[:2], ...)``, a run-time tensor once the batch is dynamic, where TVM's
        converter takes constant sizes only. The elements are read as expressions of the dims; the batch and
        channel entries must be the input's own (a Resize never changes them here), the spatial ones known."""

        @classmethod
        def convert(cls, bb, inputs, attr, params, opset, stock):
            x, sizes = inputs[0], (inputs[3] if len(inputs) > 3 else None)
            if sizes is None or isinstance(sizes, tvm.ir.GenericConst) or (isinstance(sizes, relax.ShapeExpr) and all(
                    isinstance(v, tvm.tirx.IntImm) for v in sizes.values)):
                return stock(bb, inputs, attr, params)
            values = int_elements(bb, sizes)
            dims = list(x.ty.shape.values) if getattr(x.ty, "shape", None) is not None else None
            if values is None or dims is None or len(values) != len(dims):
                return stock(bb, inputs, attr, params)
            analyzer = tvm.sym.Analyzer()
            if not all(analyzer.can_prove_equal(tvm.tirx.Cast("int64", d) if str(d.ty) != "int64" else d, v)
                       for d, v in zip(dims[:2], values[:2])):
                raise Unsupported(f"Resize to sizes {[str(v) for v in values]} changes the batch or channel size "
                                  f"of a {[str(d) for d in dims]} input")
            spatial = [analyzer.simplify(v) for v in values[2:]]
            if not all(isinstance(v, tvm.tirx.IntImm) for v in spatial):
                raise Unsupported(f"Resize to spatial sizes {[str(v) for v in spatial]} computed at run time "
                                  "(known sizes are needed)")
            static = relax.const(np.asarray([1, 1] + [int(v) for v in spatial], np.int64))
            return stock(bb, [*inputs[:3], static, *inputs[4:]], attr, params)

    return {cls.__name__: cls for cls in (SpaceToDepth, NonMaxSuppression, Resize)}
