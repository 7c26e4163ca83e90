"""Recompute a pool's expert features from its stored traces, keeping every measurement.

``python -m tvm_fusion_ext.tune.pool refeature tuning_pools/minilm-ffn-auto.npz``

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

from ..errors import FusionExtError


def refeature(path: str, out: Optional[str] = None, say: Callable[[str], None] = print) -> str:
    """Rewrite pool file ``path``'s expert features (into ``out``, default in place); a one-line summary."""
    import tvm
    from tvm import s_tir
    from tvm.s_tir.schedule import Trace

    from .driver import _stub_tensor_intrin, register_custom_rules
    from .expert_features import FEATURE_NAMES, candidate_features, machine_of
    from .pool_file import load, save
    from .pool_remeasure import _target_dict
    from .pool_tasks import get_task

    pool = load(path, traces=True)
    if pool.traces is None or len(pool.traces) != len(pool):
        raise FusionExtError(f"pool '{path}' has no traces to replay")
    target = tvm.target.Target(_target_dict(pool.meta))
    register_custom_rules()
    with _stub_tensor_intrin(target.kind.name == "llvm"):
        mod = get_task(pool.meta["task"], target).mod
        machine = machine_of(target)
        rows = []
        for i, trace in enumerate(pool.traces):
            sch = s_tir.Schedule(mod)
            try:
                Trace.apply_json_to_schedule(trace, sch)
            except Exception as err:  # noqa: BLE001  (TVM raises its own errors; name the candidate)
                raise FusionExtError(f"pool '{path}': candidate {i}'s trace no longer applies to task "
                                     f"'{pool.meta['task']}' ({str(err).splitlines()[0]})") from None
            rows.append(candidate_features(sch.mod, target, machine))
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
