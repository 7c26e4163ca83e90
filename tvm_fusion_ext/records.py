"""Tuning records on disk: ``<root>/<workload>-<target>/`` = MetaSchedule JSON database + ``manifest.json``.

The format is written by the tuner (:mod:`.tune`) and read where records are applied (:mod:`.compile`) and
shipped (:mod:`.compile.artifact`): it lives below both, so neither reaches into the other.

Files of one record directory::

    database_workload.json       one line per tuned PrimFunc (MetaSchedule's format, append-only)
    database_tuning_record.json  one line per measured candidate (MetaSchedule's format, append-only)
    manifest.json                model hash, target, trials, per-task best latency, expert-rule rejections
    logs/                        MetaSchedule's per-task logs

Crash safety: MetaSchedule's JSONDatabase opens, appends one line and closes the file for every record, so
a killed run (even ``kill -9``) loses at most the line being written; that partial last line would make
``JSONDatabase`` refuse the whole file ("Unexpected end of string"), so :func:`open_database` cuts it off
first. The manifest is only ever replaced atomically (write to a temp file, fsync, rename).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import List, Optional, Tuple

from .errors import TuningLogError
from .fileio import atomic_write_bytes

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
#: MetaSchedule records a candidate that failed to build or run with a huge run time instead of none.
FAILED_RUN_SECS = 1e9


# ----------------------------------------------------------------------------------------------- identities

def model_hash(mod) -> str:
    """Hex structural hash of the (unfused) Relax module the records were tuned for; weights included."""
    import tvm_ffi

    return "%016x" % (int(tvm_ffi.structural_hash(mod)) & (2**64 - 1))


def with_precision(mhash: str, precision: str = "fp32") -> str:
    """The model hash a record directory is keyed by: a bf16/int8 compilation's kernels are other workloads than
    the fp32 ones of the same model, so their records carry the precision (``<hash>-int8``)."""
    return mhash if precision in (None, "fp32") else f"{mhash}-{precision}"


def target_label(target) -> str:
    """Short, filename-safe target identity: ``llvm-znver3``, ``cuda-sm_90``."""
    from .targets import TargetInfo

    info = TargetInfo.of(target)  # arch: a CUDA target's sm_XX, a CPU target's LLVM cpu name
    label = f"{info.kind}-{info.arch}" if info.arch else info.kind
    return re.sub(r"[^A-Za-z0-9_.-]", "_", label)


def record_dir(root: str, workload: str, target) -> str:
    return os.path.join(root, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', workload)}-{target_label(target)}")


def is_record_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, WORKLOAD_FILE)) or os.path.isfile(os.path.join(path, MANIFEST_FILE))


# ----------------------------------------------------------------------------------------------- database

def _good_lines(path: str, keep_bad_middle: bool) -> Tuple[bytes, bool]:
    """File content without an unterminated or unparsable trailing line (and, for records, without any bad
    line); returns (content, changed)."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline, else a partial line
    changed = bool(tail.strip())
    good = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError:
            changed = True
            if keep_bad_middle and i < len(lines) - 1:
                # Workload lines are referenced by index: dropping one in the middle would re-point records.
                raise TuningLogError(f"{path}: line {i + 1} is corrupt (not a partial last line); cannot repair")
            continue
        good.append(line)
    return b"".join(line + b"\n" for line in good), changed


def repair(path: str) -> int:
    """Cut partial lines a killed run left in the database files; returns how many files were changed."""
    fixed = 0
    for name, strict in ((WORKLOAD_FILE, True), (RECORD_FILE, False)):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        content, changed = _good_lines(file, keep_bad_middle=strict)
        if changed:
            atomic_write_bytes(file, content)
            fixed += 1
    return fixed


def open_database(path: str, create: bool = False):
    """The directory's MetaSchedule ``JSONDatabase``, after cutting a partial last line left by a crash."""
    from tvm.s_tir import meta_schedule as ms

    if create:
        os.makedirs(path, exist_ok=True)  # JSONDatabase does not create the directory
    elif not os.path.isfile(os.path.join(path, WORKLOAD_FILE)):
        raise TuningLogError(f"'{path}' holds no tuning records ({WORKLOAD_FILE} missing)")
    repair(path)
    try:
        return ms.database.JSONDatabase(work_dir=path, allow_missing=create)
    except Exception as err:  # noqa: BLE001  (TVM raises RuntimeError/TVMError with multi-line text)
        raise TuningLogError(f"cannot read tuning records in '{path}': {str(err).strip().splitlines()[-1]}") \
            from None


# ----------------------------------------------------------------------------------------------- manifest

def write_manifest(path: str, manifest: dict) -> None:
    manifest = dict(manifest, version=MANIFEST_VERSION, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    atomic_write_bytes(os.path.join(path, MANIFEST_FILE), json.dumps(manifest, indent=2, sort_keys=True).encode())


def read_manifest(path: str) -> Optional[dict]:
    file = os.path.join(path, MANIFEST_FILE)
    if not os.path.isfile(file):
        return None
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as err:
        raise TuningLogError(f"{file}: not valid JSON ({err})") from None


# ----------------------------------------------------------------------------------------------- selection

def covered_note(directories: List[str]) -> str:
    """``": they cover minilm on llvm-znver3, ..."``: which (workload, host class) pairs a root's records are for."""
    pairs = []
    for d in directories:
        try:
            manifest = read_manifest(d) or {}
        except TuningLogError:
            continue
        pair = f"{manifest.get('workload', os.path.basename(d))} on {manifest.get('target', '?')}"
        if pair not in pairs:
            pairs.append(pair)
    return f": they cover {', '.join(pairs)}" if pairs else ""


def target_argument(target) -> str:
    """The ``--target`` value that names ``target``'s host class: ``llvm:znver3``, ``cuda:sm_90``, ``llvm``."""
    label = target_label(target)
    return label.replace("-", ":", 1) if "-" in label else label


def matches(manifest: Optional[dict], mhash: str, target) -> bool:
    return bool(manifest) and manifest.get("model_hash") == mhash and manifest.get("target") == target_label(target)


def select(logs: str, mod, target, precision: str = "fp32") -> Tuple[Optional[str], str]:
    """Which record directory under ``logs`` belongs to ``mod`` on ``target``.

    ``logs`` is either one record directory (used as given; a manifest for another model or target is an
    error) or a root of them (the one whose manifest matches; none matching is not an error: the build then
    runs untuned). Returns ``(directory or None, one-line message saying which was used or why none)``."""
    if not os.path.isdir(logs):
        raise TuningLogError(f"tuning-log directory '{logs}' does not exist")
    mhash, label = with_precision(model_hash(mod), precision), target_label(target)
    if is_record_dir(logs):
        manifest = read_manifest(logs)
        if manifest is not None and not matches(manifest, mhash, target):
            raise TuningLogError(
                f"'{logs}' holds records for model {manifest.get('model_hash')} on {manifest.get('target')}, "
                f"not for this model ({mhash}) on {label}")
        return logs, f"using tuning records in {logs}"
    candidates = sorted(os.path.join(logs, d) for d in os.listdir(logs) if is_record_dir(os.path.join(logs, d)))
    found = [d for d in candidates if matches(read_manifest(d), mhash, target)]
    if not found:
        from .frontend.dims import dynamic_inputs, pinning_example

        dynamic = dynamic_inputs(mod)
        pin = f" --shape {pinning_example(dynamic)}" if dynamic else ""
        return None, (f"no tuning records in {logs} match this model ({mhash}) on {label} "
                      f"({len(candidates)} directories checked{covered_note(candidates)}); building untuned; "
                      f"to tune this model for this host: `tvm-fusion tune MODEL.onnx{pin} --target "
                      f"{target_argument(target)} --logs {logs}`")
    best = max(found, key=lambda d: (read_manifest(d) or {}).get("trials", 0))
    return best, f"using tuning records in {best} (manifest matches model {mhash} on {label})"
