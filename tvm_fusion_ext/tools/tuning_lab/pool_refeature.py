"""Recompute a pool's expert features from its stored traces, keeping every measurement.

``python -m tvm_fusion_ext.tools.tuning_lab pool refeature tuning_pools/minilm-ffn-auto.npz``

Why: a pool's latencies took minutes to hours of quiet machine to measure, its expert features take
milliseconds per candidate to read from the scheduled IR. When ``expert_features.FEATURE_NAMES`` grows (a
new thing a performance engineer looks at), the pools must describe their candidates with the new columns,
or a model trained on a pool cannot score a live candidate. Nothing is built or timed: each candidate's
trace is replayed on the task's PrimFunc and :func:`expert_features.candidate_features` reads the result.
The old columns are recomputed too; the summary says how many of them changed (none, unless their
definition did).
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ...errors import FusionExtError


def refeature(path: str, out: Optional[str] = None, say: Callable[[str], None] = print) -> str:
    """Rewrite pool file ``path``'s expert features (into ``out``, default in place); a one-line summary."""
    from ...tune.expert_features import FEATURE_NAMES, candidate_features, machine_of
    from .pool_file import load, save, schedule_of, workload_of

    pool = load(path, traces=True)
    if pool.traces is None or len(pool.traces) != len(pool):
        raise FusionExtError(f"pool '{path}' has no traces to replay")
    target, mod = workload_of(pool)
    machine = machine_of(target)
    rows = []
    for i in range(len(pool)):
        rows.append(candidate_features(schedule_of(pool, i, mod).mod, target, machine))
        if (i + 1) % 500 == 0:
            say(f"refeature: {pool.name} {i + 1}/{len(pool)}")
    new = np.stack(rows).astype(np.float32)
    old_names = list(pool.meta.get("expert_feature_names", []))
    kept = [n for n in old_names if n in FEATURE_NAMES]
    changed = [n for n in kept if not np.allclose(pool.expert_features[:, old_names.index(n)],
                                                  new[:, FEATURE_NAMES.index(n)], rtol=1e-5, atol=1e-6)]
    added = [n for n in FEATURE_NAMES if n not in old_names]
    pool.expert_features = new
    pool.meta = dict(pool.meta, expert_feature_names=list(FEATURE_NAMES))
    target_path = out or path
    save(pool, target_path)
    return (f"{target_path}: expert features of {len(pool)} candidates recomputed; added "
            f"{', '.join(added) or 'none'}; changed {', '.join(changed) or 'none'}")
