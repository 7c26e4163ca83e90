"""The artifact format: one directory, and the checks its manifest and files pass before anything is loaded.

::

    OUT/
      manifest.json   what the artifact is: versions, target and CPU features, inputs/outputs with symbolic dims
                      and bounds, fusion summary, tuning records; a sha256 and size per file, one over itself
      model.so        the compiled library (``Executable.export_library``), weights lifted out
      weights.bin     the weights, raw, each tensor 64-byte aligned (:mod:`.weights`)

The writer is :mod:`tvm_fusion_ext.compile.artifact`; this module is what both sides agree on, and needs the
standard library only. Checksums guard against damage (a truncated copy, a flipped byte, a hand-edited
manifest), not against an attacker, who could recompute them.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

from ..errors import ArtifactError, CorruptArtifactError, IncompatibleArtifactError

FORMAT = "tvm_fusion_ext.artifact"
#: bump when a reader of the previous version would misread the artifact; readers refuse versions they lack
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)

MANIFEST_FILE = "manifest.json"
LIBRARY_FILE = "model.so"
WEIGHTS_FILE = "weights.bin"

_CHUNK = 1 << 22


# ----------------------------------------------------------------------------------------------- checksums

def sha256_of_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(_CHUNK)
            if not block:
                return h.hexdigest()
            h.update(block)


def sha256_of_buffer(buffer) -> str:
    """Digest of a bytes-like object (e.g. a memory-mapped numpy array) without copying it."""
    view = memoryview(buffer).cast("B")
    h = hashlib.sha256()
    for start in range(0, len(view), _CHUNK):
        h.update(view[start:start + _CHUNK])
    return h.hexdigest()


def manifest_checksum(manifest: dict) -> str:
    """sha256 of the manifest's canonical JSON without its own ``checksum`` field."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(manifest: dict) -> dict:
    return dict(manifest, checksum=manifest_checksum(manifest))


def describe_file(path: str) -> dict:
    """The manifest's entry for a file it lists."""
    return {"bytes": os.path.getsize(path), "sha256": sha256_of_file(path)}


# ----------------------------------------------------------------------------------------------- reading

def is_artifact(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_FILE))


def read_manifest(path: str) -> dict:
    """The artifact's manifest, after the checks that need nothing but the manifest itself: it exists, is JSON,
    is this format, in a version this reader knows, and has not been edited since it was written."""
    if not os.path.exists(path):
        raise ArtifactError(f"{path}: no such artifact")
    if not os.path.isdir(path):
        raise ArtifactError(f"{path}: not an artifact directory (write one with `tvm-fusion compile MODEL.onnx -o "
                            f"{os.path.basename(path)}`)")
    file = os.path.join(path, MANIFEST_FILE)
    if not os.path.isfile(file):
        raise CorruptArtifactError(f"{path}: no {MANIFEST_FILE} (not an artifact, or an incomplete copy)")
    try:
        with open(file, encoding="utf-8") as f:
            manifest = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise CorruptArtifactError(f"{file}: not valid JSON ({str(err).splitlines()[0]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptArtifactError(f"{file}: not a {FORMAT} manifest")
    version = manifest.get("format_version")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        writer = (manifest.get("producer") or {}).get("package_version", "?")
        raise IncompatibleArtifactError(
            f"{path}: artifact format version {version!r} (written by tvm_fusion_ext {writer}); this tvm_fusion_ext "
            f"reads version{'s' if len(SUPPORTED_FORMAT_VERSIONS) > 1 else ''} "
            f"{', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))}: recompile the model with this version")
    if manifest.get("checksum") != manifest_checksum(manifest):
        raise CorruptArtifactError(f"{file}: was modified after it was written (checksum mismatch); recompile or "
                                   f"copy the artifact again")
    return manifest


def check_runtime_versions(path: str, manifest: dict, tvm_version: str, ffi_version: str) -> None:
    """The library calls into TVM's runtime and tvm-ffi through their C ABI: refuse any other TVM release, and
    another tvm-ffi release (its ``.postN`` rebuilds keep the ABI)."""
    producer = manifest.get("producer") or {}
    built_tvm, built_ffi = producer.get("tvm"), producer.get("tvm_ffi")
    if built_tvm != tvm_version:
        raise IncompatibleArtifactError(f"{path}: compiled with TVM {built_tvm}, this machine has TVM {tvm_version} "
                                        f"(compiled libraries are tied to one TVM release): recompile the model "
                                        f"here or install apache-tvm=={built_tvm}")
    if _release(built_ffi) != _release(ffi_version):
        raise IncompatibleArtifactError(f"{path}: compiled with tvm-ffi {built_ffi}, this machine has tvm-ffi "
                                        f"{ffi_version}: recompile the model here or install "
                                        f"apache-tvm-ffi=={built_ffi}")


def _release(version: Optional[str]) -> Optional[str]:
    return None if version is None else str(version).split(".post")[0]


def check_file(path: str, manifest: dict, name: str, verify: bool = True) -> str:
    """Path of the artifact file ``name`` once it exists with the size the manifest records (and, with
    ``verify``, the sha256: reads the whole file)."""
    entry = _entry(path, manifest, name)
    file = os.path.join(path, name)
    if not os.path.isfile(file):
        raise CorruptArtifactError(f"{path}: {name} is missing (an incomplete copy?)")
    size = os.path.getsize(file)
    if size != entry["bytes"]:
        what = "truncated" if size < entry["bytes"] else "longer than written"
        raise CorruptArtifactError(f"{path}: {name} is {what} ({size} bytes, {MANIFEST_FILE} says {entry['bytes']})")
    if verify:
        check_digest(path, manifest, name, sha256_of_file(file))
    return file


def check_digest(path: str, manifest: dict, name: str, sha256: str) -> None:
    if sha256 != _entry(path, manifest, name)["sha256"]:
        raise CorruptArtifactError(f"{path}: {name} changed after it was written (sha256 mismatch); recompile or "
                                   f"copy the artifact again")


def _entry(path: str, manifest: dict, name: str) -> dict:
    entry = (manifest.get("files") or {}).get(name)
    if not isinstance(entry, dict) or "bytes" not in entry or "sha256" not in entry:
        raise CorruptArtifactError(f"{path}: {MANIFEST_FILE} lists no file {name!r}")
    return entry
