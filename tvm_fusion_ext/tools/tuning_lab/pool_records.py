"""A pool file as a tuning-record directory, so that a live run can warm-start from it.

``python -m tvm_fusion_ext.tools.tuning_lab pool records tuning_pools/bert-ffn-auto.npz --out warm/bert-ffn-auto``
``tvm-fusion tune model.onnx --warm-start warm/``

Why: the replay's best strategy is a ranking model pre-trained on another model's pool of the same kernel
(``rank-knobs-transfer``); the tuner's ``--warm-start DIR`` is the same transfer, but it reads MetaSchedule
databases. The repository ships six pools of measured candidates: written as databases, they are a warm start
for any run on a machine like the one that measured them (``warm_start.py`` skips records of another
target). Each measured candidate becomes one record: its trace, the task's PrimFunc as the workload, and the
pool's latency (the re-measured one, when the pool was re-measured) as its run time. Candidates that failed
to build or run carry no run time and are left out.
"""

from __future__ import annotations

import os
import numpy as np

from ...errors import FusionExtError


def export_records(path: str, out: str) -> str:
    """Write pool ``path``'s measured candidates into record directory ``out``; a one-line summary."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from ... import records
    from .pool_file import load, schedule_of, workload_of

    pool = load(path, traces=True)
    if pool.traces is None or len(pool.traces) != len(pool):
        raise FusionExtError(f"pool '{path}' has no traces to export")
    if os.path.exists(os.path.join(out, records.RECORD_FILE)):
        raise FusionExtError(f"'{out}' already holds tuning records: export into a new directory")
    target, mod = workload_of(pool)
    measured = np.flatnonzero(np.isfinite(pool.latency_us) & (pool.status == 0))
    database = records.open_database(out, create=True)
    workload = database.commit_workload(mod)
    for i in measured:
        sch = schedule_of(pool, int(i), mod)
        args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
        seconds = [tvm.tirx.FloatImm("float64", float(pool.latency_us[i]) * 1e-6)]
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, seconds, target, args))
    records.write_manifest(out, {"workload": f"pool:{pool.name}", "target": records.target_label(target),
                                 "target_spec": str(target), "source_pool": os.path.basename(path),
                                 "records": int(measured.size),
                                 "note": "exported from a candidate pool: a --warm-start source, not a tuned "
                                         "model's records"})
    return (f"{out}: {measured.size} measured candidates of pool {pool.name} as tuning records for "
            f"{records.target_label(target)} (warm-start with --warm-start {out})")
