"""A built model you call with inputs by ONNX name and get outputs by ONNX name."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np
import tvm
from tvm import relax

from .errors import InputError


class CompiledModel:
    """Executable + VM + the model's I/O contract (names, static shapes, dtypes)."""

    def __init__(self, executable, target: tvm.target.Target, input_specs: Dict[str, tuple],
                 output_names: List[str], label: str = "model"):
        self.executable = executable
        self.target = target
        self.input_specs = dict(input_specs)
        self.output_names = list(output_names)
        self.label = label
        self.device = tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)
        self._vm = relax.VirtualMachine(executable, self.device)

    @classmethod
    def from_module(cls, mod: tvm.IRModule, target=None, logs: Optional[str] = None, fuse: bool = True,
                    label: str = "model") -> "CompiledModel":
        from .build import build
        from .targets import resolve_target
        from .frontend import input_specs, output_names

        tgt = resolve_target(target)
        ex = build(mod, tgt, logs=logs, fuse=fuse)
        return cls(ex, tgt, input_specs(mod), output_names(mod), label)

    @classmethod
    def from_onnx(cls, model, target=None, shapes=None, logs: Optional[str] = None, fuse: bool = True):
        from .frontend import load_onnx

        mod = load_onnx(model, shapes=shapes)
        return cls.from_module(mod, target, logs=logs, fuse=fuse, label=str(model) if isinstance(model, str)
                               else "model")

    # -- inputs ---------------------------------------------------------------------------------------
    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> List[np.ndarray]:
        return check_inputs(self.input_specs, inputs, self.label)

    # -- running --------------------------------------------------------------------------------------
    def _call(self, tensors):
        return self._vm["main"](*tensors)

    def _to_device(self, arrays):
        return [tvm.runtime.tensor(a, self.device) for a in arrays]

    def run(self, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        result = self._call(self._to_device(self.check_inputs(inputs)))
        flat = _flatten(result)
        return dict(zip(self.output_names, flat))

    def bind(self, inputs: Mapping[str, np.ndarray]):
        """A zero-argument call running the model on ``inputs`` already on the device (for timing)."""
        tensors = self._to_device(self.check_inputs(inputs))

        def call():
            self._call(tensors)
            self.device.sync()

        return call


def check_inputs(specs: Dict[str, tuple], inputs: Mapping[str, np.ndarray], label: str = "model") -> List[np.ndarray]:
    """Arrays in parameter order, or an InputError naming the first problem (before anything is built or run)."""
    unknown = [n for n in inputs if n not in specs]  # first: a misspelt name explains the missing one
    if unknown:
        raise InputError(f"{label}: unknown input '{unknown[0]}' (expected {list(specs)})")
    missing = [n for n in specs if n not in inputs]
    if missing:
        raise InputError(f"{label}: missing input '{missing[0]}' (expected {list(specs)})")
    arrays = []
    for name, (shape, dtype) in specs.items():
        a = np.asarray(inputs[name])
        if tuple(a.shape) != tuple(shape):
            raise InputError(f"{label}: input '{name}' has shape {list(a.shape)}, the model was built for {list(shape)}")
        if str(a.dtype) != dtype:
            raise InputError(f"{label}: input '{name}' has dtype {a.dtype}, expected {dtype}")
        arrays.append(np.ascontiguousarray(a).reshape(a.shape))  # 0-d stays 0-d
    return arrays


def _flatten(result) -> List[np.ndarray]:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    out = []
    for r in result:
        out.extend(_flatten(r))
    return out
