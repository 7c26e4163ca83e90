"""``load(path)``: an artifact written by ``tvm-fusion compile``, ready to run, with TVM's runtime and numpy only.

Everything that can be checked is checked before the library is loaded, cheapest first: the manifest (format
version, its own checksum), the TVM and tvm-ffi releases the library was built against, the CPU features and
GPU it needs, then each file's size and sha256. A library is loaded only after all of that, because loading
or calling a library built for another CPU can kill the process (SIGILL) instead of raising.
"""

from __future__ import annotations

import os
import threading
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from ..errors import CorruptArtifactError
from . import host
from .kv_cache import check_cache_step
from .io import InputBuffers, call_checked, check_inputs, flatten_outputs, input_tensors
from .native_log import SCOPE_LOADED, dropping
from .manifest import (LIBRARY_FILE, WEIGHTS_FILE, check_digest, check_file, check_runtime_versions, read_manifest,
                       sha256_of_buffer)
from .threads import configure_cpu_threads
from .weights import (check_weight_pages, map_weights, on_cpu, read_into_huge_pages, to_device, views,
                      weight_pages_for)


class DeployedModel:
    """A loaded artifact. ``run(inputs)`` takes and returns dicts of numpy arrays by ONNX name.

    Safe to call from several threads at once: TVM's Relax VM is not re-entrant, so each calling thread gets its
    own VM over the one loaded library and the one set of weight tensors (a VM costs microseconds)."""

    def __init__(self, path: str, manifest: dict, library, weights: list, device, weight_pages: str = "file"):
        self.path = path
        self.manifest = manifest
        self.device = device
        #: what holds the weights: ``"huge"`` (memory on 2 MiB pages), ``"file"`` (the weights file mapped),
        #: ``"device"`` (copied to the GPU) or ``"none"`` (the model has no weights file)
        self.weight_pages = weight_pages
        #: ``{onnx input name: (shape, dtype)}``; a dim is an int or the name of a symbolic dim
        self.input_specs: Dict[str, Tuple[tuple, str]] = {
            i["name"]: (tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"]}
        self.output_names: List[str] = [o["name"] for o in manifest["outputs"]]
        #: ``{dim name: (lower, upper or None)}`` for the symbolic dims of the inputs
        self.dim_bounds: Dict[str, Tuple[int, Optional[int]]] = {
            name: (int(b["min"]), None if b.get("max") is None else int(b["max"]))
            for name, b in (manifest.get("dims") or {}).items()}
        #: where each bound came from, as the manifest's ``why`` records it (older manifests have none)
        self.dim_reasons: Dict[str, Dict[str, str]] = {
            name: {side: why for side, why in (("upper", (b.get("why") or {}).get("max")),
                                               ("lower", (b.get("why") or {}).get("min"))) if why}
            for name, b in (manifest.get("dims") or {}).items()}
        #: how the KV cache is kept: ``{"mode": "concat"}`` or, for an in-place build, ``{"mode": "inplace",
        #: "capacity": N, "past_inputs": [...], "length_input": "past_length", ...}`` (:mod:`.kv_cache`)
        self.kv_cache: Dict = dict(manifest.get("kv_cache") or {"mode": "concat"})
        self._library = library
        self._weights = weights
        self._local = threading.local()
        self._lock = threading.Lock()
        self._inputs = InputBuffers(list(self.input_specs), device, self.check_inputs)

    def __repr__(self) -> str:
        return f"DeployedModel({self.path!r}, target {self.manifest['target']['string']!r})"

    # -- inputs ---------------------------------------------------------------------------------------
    def check_inputs(self, inputs: Mapping[str, np.ndarray]) -> List[np.ndarray]:
        arrays = check_inputs(self.input_specs, inputs, self.path, self.dim_bounds, self.dim_reasons)
        check_cache_step(self.kv_cache, inputs, self.path)
        return arrays

    # -- running --------------------------------------------------------------------------------------
    def new_vm(self):
        """A VM of its own over the loaded library (:func:`~tvm_fusion_ext.deploy.profile.profile_kernels`
        instruments one)."""
        from tvm.runtime.vm import VirtualMachine

        with self._lock:  # creating VMs from one library concurrently is not documented as safe
            return VirtualMachine(self._library, self.device)

    def _main(self):
        main = getattr(self._local, "main", None)
        if main is None:
            vm = self.new_vm()
            self._local.vm, self._local.main = vm, vm["main"]
            main = self._local.main
        return main

    def device_arguments(self, inputs: Mapping[str, np.ndarray]) -> list:
        """``main``'s arguments: ``inputs`` checked and copied to the device, then the weights."""
        return input_tensors(self.check_inputs(inputs), self.device) + list(self._weights)

    def run(self, inputs: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        check_cache_step(self.kv_cache, inputs, self.path)  # the buffers' fast path skips check_inputs
        args = self._inputs.tensors(inputs) + list(self._weights)
        result = call_checked(lambda: self._main()(*args), self.input_specs, inputs, self.path)
        return dict(zip(self.output_names, flatten_outputs(result)))

    def bind(self, inputs: Mapping[str, np.ndarray]):
        """A zero-argument call running the model on ``inputs`` already on the device (for timing)."""
        tensors = self.device_arguments(inputs)
        main = self._main()

        def call():
            main(*tensors)
            self.device.sync()

        return call


def load(path: str, num_threads: Optional[int] = None, device_id: int = 0, verify: bool = True,
         check_cpu: bool = True, weight_pages: str = "auto") -> DeployedModel:
    """Load the artifact directory ``path`` (see :mod:`.manifest` for its layout).

    ``num_threads``: TVM's CPU thread pool size (default: every core this process may use). ``verify=False``
    skips the sha256 of the library and weights (sizes are still checked): for very large models whose
    files are trusted. ``check_cpu=False`` skips the CPU-feature check where ``/proc/cpuinfo`` is unreadable.
    ``weight_pages`` (CPU): ``"huge"`` reads the weights into memory on 2 MiB pages, ``"file"`` maps the weights
    file, ``"auto"`` (default) takes ``TFX_WEIGHT_PAGES`` if set, else huge pages where the kernel offers them
    and the weights are over one such page and under half the available memory (:mod:`.weights`); what was
    used is :attr:`DeployedModel.weight_pages`.
    Raises :class:`~tvm_fusion_ext.errors.ArtifactError` (one line) for anything that stops the load."""
    import tvm
    import tvm_ffi

    check_weight_pages(weight_pages)
    path = os.fspath(path)
    manifest = read_manifest(path)
    check_runtime_versions(path, manifest, tvm.__version__, tvm_ffi.__version__)
    target = manifest["target"]
    if check_cpu:
        host.check_cpu(path, target["cpu"])
    is_cuda = target["family"] == "cuda"
    device = host.cuda_device(path, target.get("arch"), device_id) if is_cuda else tvm.cpu(0)

    library_file = check_file(path, manifest, LIBRARY_FILE, verify=verify)
    weights, held = _load_weights(path, manifest, device, verify, weight_pages)
    if not is_cuda:
        configure_cpu_threads(num_threads)
    try:
        with dropping([SCOPE_LOADED]):
            library = tvm.runtime.load_module(library_file)
    except Exception as err:  # noqa: BLE001  (the checksum passed: a broken toolchain or missing system library)
        raise CorruptArtifactError(f"{path}: cannot load {LIBRARY_FILE}: {_first_line(err)}") from None
    return DeployedModel(path, manifest, library, weights, device, weight_pages=held)


def _load_weights(path: str, manifest: dict, device, verify: bool, pages: str) -> Tuple[list, str]:
    """The weight tensors, and what holds them (:attr:`DeployedModel.weight_pages`)."""
    index = manifest.get("weights") or []
    if not index:
        return [], "none"
    file = check_file(path, manifest, WEIGHTS_FILE, verify=False)
    held = weight_pages_for(pages, os.path.getsize(file)) if on_cpu(device) else "device"
    try:
        mapping = read_into_huge_pages(file) if held == "huge" else map_weights(file)
    except (OSError, ValueError) as err:
        raise CorruptArtifactError(f"{path}: cannot read {WEIGHTS_FILE}: {_first_line(err)}") from None
    if verify:  # what is checked is the buffer the kernels will read, not a second read of the file
        check_digest(path, manifest, WEIGHTS_FILE, sha256_of_buffer(mapping))
    try:
        arrays = views(mapping, index)
    except ValueError as err:
        raise CorruptArtifactError(f"{path}: {WEIGHTS_FILE}: {err}") from None
    return to_device(arrays, device), held


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"
