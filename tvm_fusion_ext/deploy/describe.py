"""What an artifact is, and whether this machine can load it, without loading it.

A team deploying an artifact asks two things before it serves anything: what does it take (input names, dtypes,
which dims are symbolic and within which bounds), and will it run here. :func:`describe` answers both from the
manifest, and runs every check :func:`.loader.load` would run before it opens the library (TVM and tvm-ffi
releases, CPU architecture and features, the GPU, each file's size and sha256), collecting every refusal rather
than stopping at the first. The library itself is never loaded, so a build for a CPU this machine lacks is
reported, not run into (SIGILL).
"""

from __future__ import annotations

import os
from typing import Callable, List

from ..errors import ArtifactError
from ..fileio import human_size
from . import host
from .manifest import LIBRARY_FILE, WEIGHTS_FILE, check_file, check_runtime_versions, read_manifest


def describe(path: str, verify: bool = True) -> dict:
    """The artifact at ``path`` as a dict (the JSON of ``tvm-fusion info --json``), with ``here``: whether
    :func:`~tvm_fusion_ext.deploy.load` would load it on this machine and, if not, every reason (one line each).
    ``verify=False`` checks file sizes but not their sha256 (which reads every byte of the weights).
    An unreadable, foreign or edited manifest raises :class:`~tvm_fusion_ext.errors.ArtifactError`: nothing
    else in the directory can be trusted then."""
    import tvm
    import tvm_ffi

    path = os.fspath(path)
    manifest = read_manifest(path)
    target = manifest.get("target") or {}
    problems: List[str] = []

    def attempt(check: Callable, *args) -> None:
        try:
            check(*args)
        except ArtifactError as err:
            problems.append(str(err))

    attempt(check_runtime_versions, path, manifest, tvm.__version__, tvm_ffi.__version__)
    attempt(host.check_cpu, path, target.get("cpu") or {})
    if target.get("family") == "cuda":
        attempt(host.cuda_device, path, target.get("arch"))
    files = [LIBRARY_FILE] + ([WEIGHTS_FILE] if manifest.get("weights") else [])
    for name in files:
        attempt(check_file, path, manifest, name, verify)

    producer = manifest.get("producer") or {}
    weights = manifest.get("weights") or []
    records = manifest.get("records") or {}
    return {
        "path": path,
        "format_version": manifest.get("format_version"),
        "created": manifest.get("created"),
        "producer": {k: producer.get(k) for k in ("package_version", "tvm", "tvm_ffi", "python", "built_on")},
        "target": {"string": target.get("string"), "family": target.get("family"), "arch": target.get("arch")},
        "inputs": manifest.get("inputs") or [],
        "outputs": manifest.get("outputs") or [],
        "dims": manifest.get("dims") or {},
        "fused": (manifest.get("fusion") or {}).get("fused") or {},
        "records": {"dir": records.get("dir"), "note": records.get("note"),
                    "transferred": len(records.get("transferred") or [])},
        "files": {name: int(entry.get("bytes", 0)) for name, entry in (manifest.get("files") or {}).items()},
        "weights": {"tensors": len(weights), "bytes": sum(int(w.get("bytes", 0)) for w in weights)},
        "here": {"loadable": not problems, "problems": problems, "sha256_checked": bool(verify),
                 "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__, "machine": host.machine_arch()},
    }


def format_description(info: dict) -> str:
    """``describe``'s dict as the text ``tvm-fusion info`` prints."""
    producer, target, here = info["producer"], info["target"], info["here"]
    lines = [
        f"artifact  {info['path']}  (format {info['format_version']}, written {info.get('created') or '?'} by "
        f"tvm_fusion_ext {producer.get('package_version')}, TVM {producer.get('tvm')}, "
        f"tvm-ffi {producer.get('tvm_ffi')})",
        "target    " + " ".join(str(x) for x in (target.get("family"), target.get("arch"), target.get("string")) if x),
    ]
    for kind in ("inputs", "outputs"):
        for i, spec in enumerate(info[kind]):
            shape = ", ".join(str(d) for d in spec.get("shape", []))
            lines.append(f"{kind if i == 0 else '':9s} {spec.get('name')}: {spec.get('dtype')} [{shape}]")
    for i, (name, bound) in enumerate(sorted(info["dims"].items())):
        top = bound.get("max")
        why = (bound.get("why") or {}).get("max")
        lines.append(f"{'dims' if i == 0 else '':9s} {name}: {bound.get('min', 1)} .. "
                     f"{'unbounded' if top is None else top}" + (f"  ({why})" if why else ""))
    fused = ", ".join(f"{k} {v}" for k, v in info["fused"].items() if v) or "nothing"
    lines.append(f"fused     {fused}")
    records = info["records"]
    lines.append(f"records   {records.get('note') or records.get('dir') or 'none'}"
                 + (f"; knobs transferred to {records['transferred']} signature(s)" if records["transferred"] else ""))
    sizes = ", ".join(f"{name} {human_size(n)}" for name, n in info["files"].items())
    lines.append(f"files     {sizes} ({info['weights']['tensors']} weight tensors)")
    if here["loadable"]:
        files = "file sizes and sha256" if here["sha256_checked"] else "file sizes (not their sha256)"
        lines.append(f"here      loadable (checked: TVM {here['tvm']} and tvm-ffi {here['tvm_ffi']}, the CPU, {files})")
    else:
        lines.append("here      NOT loadable:")
        lines.extend(f"            {problem}" for problem in here["problems"])
    return "\n".join(lines)
