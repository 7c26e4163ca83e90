"""``tvm-fusion compile``: a model → one artifact directory that :func:`tvm_fusion_ext.deploy.load` runs anywhere
TVM's runtime is installed (layout and checks: :mod:`tvm_fusion_ext.deploy.manifest`).

The compilation is :func:`.compile_model` with ``lift_weights=True`` (weights beside the library, see
:mod:`.codegen.weights`). The artifact is written into a temporary directory next to ``out`` and renamed into place
at the end, so a failed or interrupted compile leaves no partial artifact, and an existing artifact at
``out`` is replaced only by a complete one.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from typing import Mapping, Optional, Sequence

import tvm

from ..deploy import host
from ..deploy.manifest import (FORMAT, FORMAT_VERSION, LIBRARY_FILE, MANIFEST_FILE, WEIGHTS_FILE, describe_file,
                               is_artifact, seal, sha256_of_file)
from ..deploy.weights import ALIGNMENT, write_weights
from ..errors import ArtifactError
from ..targets import TargetInfo, TargetSpec, resolve_target
from .pipeline import Compiled, compile_model


def compile_artifact(model, out: str, target: TargetSpec = None, logs: Optional[str] = None,
                     shapes: Optional[Mapping[str, Sequence[int]]] = None,
                     max_shapes: Optional[Mapping[str, Sequence[int]]] = None, fuse_graph: bool = True,
                     remove_padding: bool = False, precision: str = "fp32", samples=None,
                     samples_source: str = "given", min_cosine: Optional[float] = None,
                     kv_cache: str = "concat") -> dict:
    """Import the ONNX ``model``, compile it for ``target`` (tuning records from ``logs``) and write the artifact
    directory ``out``; returns its manifest. ``shapes`` pins input dims (a static build), ``max_shapes`` bounds
    the symbolic ones (``NAME: [max dims]``, as ``--max-shape``). ``precision`` other than fp32: the outputs
    are measured against the fp32 build on ``samples`` (input dicts; ``samples_source`` says where they came
    from; int8 also calibrates its activation smoothing on them) and the accuracy contract (:mod:`.accuracy`) goes into the manifest's ``precision`` entry, passed or
    not (``manifest["precision"]["accuracy"]["passed"]``). ``kv_cache``: ``concat`` or ``inplace``
    (:mod:`.kv_cache`; the manifest's ``kv_cache`` entry, and its inputs show the buffers and ``past_length``)."""
    from ..frontend import load_onnx
    from .precision import check_precision

    precision = check_precision(precision)
    check_destination(out)
    target = resolve_target(target)  # a bad target is refused before the model is read
    mod = load_onnx(model, shapes=shapes, max_shapes=max_shapes)
    compiled = compile_model(mod, target, logs=logs, fuse_graph=fuse_graph, lift_weights=True,
                             remove_padding=remove_padding, precision=precision, calibration=samples,
                             kv_cache=kv_cache)
    if precision != "fp32" and compiled.precision.kernels:
        if not TargetInfo.of(target).is_cpu:
            # the contract runs both builds in this process (accuracy.run_compiled: CPU only)
            compiled.precision.notes.append(f"accuracy against fp32 not measured: a {target.kind.name} build "
                                            f"runs on its device, not here")
        elif compiled.kv_cache.mode != "concat":
            compiled.precision.notes.append("accuracy against fp32 not measured: the sample inputs are the "
                                            "exported model's, not the in-place cache's")
        elif samples:
            from .accuracy import measure

            reference = compile_model(mod, target, fuse_graph=fuse_graph, lift_weights=True,
                                      remove_padding=remove_padding, precision="fp32")
            compiled.precision.accuracy = measure(mod, compiled, reference, samples, samples_source, min_cosine)
        else:
            compiled.precision.notes.append("accuracy against fp32 not measured: no sample inputs")
    source = None
    if isinstance(model, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(model))
        source = {"path": path, "sha256": sha256_of_file(path), "shapes": _plain(shapes),
                  "max_shapes": _plain(max_shapes)}
    return save_artifact(compiled, mod, out, source)


def save_artifact(compiled: Compiled, mod: tvm.IRModule, out: str, source: Optional[dict] = None) -> dict:
    """Write ``compiled`` (from :func:`.compile_model` of ``mod``, with ``lift_weights=True``) as the artifact
    directory ``out``; returns its manifest."""
    out = os.path.abspath(os.fspath(out))
    check_destination(out)
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        files = {LIBRARY_FILE: _write_library(compiled, os.path.join(tmp, LIBRARY_FILE))}
        index = []
        if compiled.weights:
            weights_file = os.path.join(tmp, WEIGHTS_FILE)
            with open(weights_file, "wb") as f:
                index = write_weights(f, compiled.weights)
                f.flush()
                os.fsync(f.fileno())
            files[WEIGHTS_FILE] = describe_file(weights_file)
        manifest = seal(build_manifest(compiled, mod, index, files, source))
        _write_json(os.path.join(tmp, MANIFEST_FILE), manifest)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def check_destination(out: str) -> None:
    """Refuse to replace anything but an earlier artifact (or an empty directory) at ``out``."""
    out = os.fspath(out)
    if os.path.isfile(out) or os.path.islink(out):
        raise ArtifactError(f"{out}: exists and is a file; an artifact is a directory (choose another -o)")
    if os.path.isdir(out) and os.listdir(out) and not is_artifact(out):
        raise ArtifactError(f"{out}: exists and is not an artifact directory; refusing to replace it")


# ----------------------------------------------------------------------------------------------- manifest

def build_manifest(compiled: Compiled, mod: tvm.IRModule, weights_index: list, files: dict,
                   source: Optional[dict]) -> dict:
    import tvm_ffi
    from tvm.target import codegen

    from .. import __version__

    inputs, outputs, dims = _io_specs(mod)
    kv_cache = compiled.kv_cache.to_json() if compiled.kv_cache is not None else {"mode": "concat"}
    if kv_cache["mode"] == "inplace":
        inputs, outputs, dims = _inplace_io(compiled.kv_cache, mod, inputs, outputs, dims)
    report = compiled.report
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "producer": {"package": "tvm_fusion_ext", "package_version": __version__, "tvm": tvm.__version__,
                     "tvm_ffi": tvm_ffi.__version__, "python": platform.python_version(),
                     "built_on": {"machine": platform.machine(), "cpu": str(codegen.llvm_get_system_cpu())}},
        "source": source,
        "target": _target_entry(compiled.target),
        "inputs": inputs,
        "outputs": outputs,
        "dims": dims,
        "fusion": None if report is None else {"fused": dict(report.fused), "canonicalized": report.canonicalized,
                                               "padding_removed": report.padding_removed,
                                               "refused": len(report.refused)},
        "records": _records_entry(compiled),
        "precision": (compiled.precision.to_dict() if compiled.precision is not None
                      else {"precision": "fp32", "converted": {}, "kept_fp32": [], "notes": [], "features": []}),
        "kv_cache": kv_cache,
        "weights": weights_index,
        "weights_alignment": ALIGNMENT,
        "files": files,
    }


def _target_entry(target: tvm.target.Target) -> dict:
    """The full target, and what its LLVM code (the model on CPU, the host side on CUDA) needs of a CPU."""
    from tvm.target import codegen

    info = TargetInfo.of(target)
    llvm = target.host if info.is_cuda and target.host is not None else target
    features = sorted(str(f) for f in codegen.llvm_get_cpu_features(llvm))
    triple = str(llvm.attrs.get("mtriple") or codegen.llvm_get_system_triple())
    return {
        "family": info.family,
        "kind": info.kind,
        "arch": info.arch,
        "string": str(target),
        "config": _plain(target.export()),
        "cpu": {"triple": triple, "mcpu": str(llvm.attrs.get("mcpu") or "") or None,
                "mattr": [str(a) for a in (llvm.attrs.get("mattr") or [])],
                "checked_features": host.checked_features(host.arch_of_triple(triple), features),
                "llvm_features": features},
    }


def _io_specs(mod: tvm.IRModule):
    """Inputs and outputs (names, dtypes, shapes with symbolic dim names) and each dim name's bounds."""
    from tvm import relax

    from ..frontend import input_names, output_names

    main = mod["main"]
    inputs = []
    for name, param in zip(input_names(mod), main.params):
        if not isinstance(param.ty, relax.TensorType) or param.ty.shape is None:
            raise ArtifactError(f"input '{name}' is not a tensor of known rank; an artifact needs every input's "
                                f"rank")
        inputs.append({"name": name, "dtype": str(param.ty.dtype), "shape": _dims(param.ty.shape)})
    ret = main.ret_ty if hasattr(main, "ret_ty") else main.body.ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    outputs = [{"name": name, "dtype": str(getattr(ty, "dtype", "")) or None,
                "shape": _dims(ty.shape) if getattr(ty, "shape", None) is not None else None}
               for name, ty in zip(output_names(mod), fields)]
    names = sorted({d for i in inputs for d in i["shape"] if isinstance(d, str) and d.isidentifier()})
    from ..frontend.dims import bound_reasons, shape_bounds

    bounds, reasons = shape_bounds(mod), bound_reasons(mod)
    dims = {}
    for n in names:
        low, high = bounds.get(n, (1, None))
        dims[n] = {"min": int(low), "max": None if high is None else int(high)}
        why = reasons.get(n, {})
        if why:  # where each bound came from: "max" a default, the user, the graph's table, or an in-range read
            dims[n]["why"] = {"max": why.get("upper"), **({"min": why["lower"]} if "lower" in why else {})}
    return inputs, outputs, dims


def _inplace_io(kv, mod, inputs, outputs, dims):
    """The in-place cache's interface: past inputs and their present outputs at the capacity, ``past_length``
    after the model's inputs; the past dim's bounds stay in ``dims`` (they bound ``past_length``'s value)."""
    specs = kv.input_specs({i["name"]: (tuple(i["shape"]), i["dtype"]) for i in inputs})
    inputs = [{"name": n, "dtype": dtype, "shape": list(shape)} for n, (shape, dtype) in specs.items()]
    outputs = [dict(o, shape=[*o["shape"][:2], kv.capacity, *o["shape"][3:]])
               if "present" in o["name"] and o.get("shape") and len(o["shape"]) == 4 else o for o in outputs]
    return inputs, outputs, dims


def _dims(shape) -> list:
    out = []
    for d in shape.values:
        if isinstance(d, tvm.tirx.IntImm):
            out.append(int(d))
        elif isinstance(d, tvm.tirx.Var):
            out.append(str(d.name))
        else:
            out.append(str(d))  # an expression of dim names, e.g. "seq * 2"
    return out


def _records_entry(compiled: Compiled) -> dict:
    # with --logs: the knobs that reached kernels no record matched, and what could not transfer
    transfer = {"logs": os.path.abspath(compiled.logs), "transferred": compiled.transferred,
                **compiled.transfer_refusals} if compiled.transfer_refusals else {}
    if compiled.records is None:
        return {"dir": None, "note": compiled.records_note, **transfer}
    from ..records import MANIFEST_FILE as RECORDS_MANIFEST, read_manifest

    directory = os.path.abspath(compiled.records)
    manifest_file = os.path.join(directory, RECORDS_MANIFEST)
    manifest = read_manifest(directory) or {}
    return {"dir": directory, "note": compiled.records_note,
            "manifest_sha256": sha256_of_file(manifest_file) if os.path.isfile(manifest_file) else None,
            "model_hash": manifest.get("model_hash"), "target": manifest.get("target"),
            "trials": manifest.get("trials"), **transfer}


# ----------------------------------------------------------------------------------------------- files

def _write_library(compiled: Compiled, file: str) -> dict:
    try:
        compiled.executable.export_library(file)
    except Exception as err:  # noqa: BLE001  (a missing C compiler or linker error, from deep inside TVM)
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        raise ArtifactError(f"cannot write the compiled library ({type(err).__name__}: "
                            f"{lines[-1] if lines else ''}); export_library needs a C compiler (cc/g++)") from None
    return describe_file(file)


def _write_json(file: str, obj: dict) -> None:
    import json

    with open(file, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _move_into_place(tmp: str, out: str) -> None:
    """``tmp`` becomes ``out``; an earlier artifact there is removed only once the new one is in place."""
    old = None
    if os.path.exists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=os.path.dirname(out))
        os.rmdir(old)
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _plain(value):
    """JSON-able copy of target exports and shape dicts (tuples, TVM strings and ints)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return str(value)
