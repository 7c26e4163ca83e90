"""A model compiled in this process, called with inputs by ONNX name, returning outputs by ONNX name."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import numpy as np
import tvm

from .deploy.io import InputBuffers, call_checked, check_inputs, flatten_outputs, input_tensors
from .deploy.kv_cache import check_cache_step
from .targets import TargetInfo, device_of


class CompiledModel:
    """Executable + VM + the model's I/O contract (names, shapes, dtypes)."""

    def __init__(self, executable, target: tvm.target.Target, input_specs: Dict[str, tuple],
                 output_names: List[str], label: str = "model", compiled=None, bounds: Optional[dict] = None,
                 bound_reasons: Optional[dict] = None):
        from tvm import relax

        from .deploy.threads import configure_cpu_threads

        self.executable = executable
        self.target = target
        self.input_specs = dict(input_specs)
        self.output_names = list(output_names)
        self.label = label
        #: ``{symbolic dim: (lower, upper)}`` (empty for a static model)
        self.bounds = dict(bounds or {})
        #: ``{symbolic dim: {"upper"|"lower": where that bound came from}}`` (:func:`~tvm_fusion_ext.frontend.dims.bound_reasons`)
        self.bound_reasons = dict(bound_reasons or {})
        #: the :class:`~tvm_fusion_ext.compile.Compiled` it came from (fusion report, records used), if known
        self.compiled = compiled
        #: how the KV cache is kept (as an artifact's manifest records it: :mod:`.deploy.kv_cache`)
        self.kv_cache = (compiled.kv_cache.to_json() if compiled is not None and compiled.kv_cache is not None
                         else {"mode": "concat"})
        self.device = device_of(target)
        info = TargetInfo.of(target)
        if info.is_cpu:
            configure_cpu_threads(info.cores)
        self._vm = relax.VirtualMachine(executable, self.device)
        self._input_buffers = InputBuffers(list(self.input_specs), self.device, self.check_inputs)

    @classmethod
    def from_module(cls, mod: tvm.IRModule, target=None, logs: Optional[str] = None, fuse: bool = True,
                    label: str = "model", knobs: Optional[dict] = None,
                    remove_padding: bool = False, precision: str = "fp32", calibration=None,
                    kv_cache: str = "concat") -> "CompiledModel":
        from .compile import compile_model
        from .frontend.dims import bound_reasons, shape_bounds
        from .frontend import input_specs, output_names

        compiled = compile_model(mod, target, logs=logs, fuse_graph=fuse, knobs=knobs, remove_padding=remove_padding,
                                 precision=precision, calibration=calibration, kv_cache=kv_cache)
        specs = compiled.kv_cache.input_specs(input_specs(mod))  # an in-place cache adds past_length
        return cls(compiled.executable, compiled.target, specs, output_names(mod), label, compiled,
                   shape_bounds(mod), bound_reasons(mod))

    @classmethod
    def from_onnx(cls, model, target=None, shapes=None, logs: Optional[str] = None, fuse: bool = True,
                  precision: str = "fp32", calibration=None):
        """Import and compile the ONNX ``model``. int8 without ``calibration`` (input dicts) calibrates its
        activation smoothing on generated inputs (:func:`~.compile.calibration.generated_samples`)."""
        from .frontend import load_onnx

        mod = load_onnx(model, shapes=shapes)
        if calibration is None:
            from .compile.calibration import default_calibration

            calibration = default_calibration(model, precision, shapes)
        return cls.from_module(mod, target, logs=logs, fuse=fuse, label=str(model) if isinstance(model, str)
                               else "model", precision=precision, calibration=calibration)

    @property
    def report(self):
        """The FusionReport of the compilation (None without fusion or when built elsewhere)."""
        return self.compiled.report if self.compiled is not None else None

    @property
    def precision(self) -> str:
        """The precision its dense kernels compute in (``fp32`` when built elsewhere)."""
        return self.compiled.precision_name if self.compiled is not None else "fp32"

    # -- inputs ---------------------------------------------------------------------------------------
    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> List[np.ndarray]:
        arrays = check_inputs(self.input_specs, inputs, self.label, self.bounds, self.bound_reasons)
        check_cache_step(self.kv_cache, inputs, self.label)
        return arrays

    # -- running --------------------------------------------------------------------------------------
    def _call(self, tensors):
        return self._vm["main"](*tensors)

    def new_vm(self):
        """A VM of its own over the executable (:func:`~tvm_fusion_ext.deploy.profile.profile_kernels`)."""
        from tvm import relax

        return relax.VirtualMachine(self.executable, self.device)

    def device_arguments(self, inputs: Mapping[str, np.ndarray]) -> list:
        """``main``'s arguments: ``inputs`` checked and copied to the device."""
        return input_tensors(self.check_inputs(inputs), self.device)

    def run(self, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        check_cache_step(self.kv_cache, inputs, self.label)  # the buffers' fast path skips check_inputs
        tensors = self._input_buffers.tensors(inputs)
        result = call_checked(lambda: self._call(tensors), self.input_specs, inputs, self.label)
        return dict(zip(self.output_names, flatten_outputs(result)))

    def bind(self, inputs: Mapping[str, np.ndarray]):
        """A zero-argument call running the model on ``inputs`` already on the device (for timing)."""
        tensors = self.device_arguments(inputs)

        def call():
            self._call(tensors)
            self.device.sync()

        return call
