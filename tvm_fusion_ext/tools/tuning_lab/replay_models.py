"""Cost models for the replay benchmark: what each search strategy learns from the candidates it measured.

Two kinds, both fed from a pool file's stored features (no schedule is rebuilt):

* :class:`MetaScheduleXGB` drives MetaSchedule's own ``XGBModel`` offline, unchanged: its ``update`` and
  ``predict`` run as in a tuning run (the driver's ``num_warmup_samples=8``, adaptive retraining when the data
  grew by a fifth, costs normalised by the best of their workload, pack-sum regression over per-store rows,
  random scores before warm-up). Only its feature extractor is replaced by a lookup of the rows
  ``PerStoreFeature`` gave for the candidate when it was collected (optionally with the expert features
  appended to every row).
* :class:`RankXGB` is ours (the offline twin of the tuner's ``rank_model.RankModel``): one row per candidate (per-store rows summed, as the pack-sum model does, and
  their maximum, plus the expert features), XGBoost with a pairwise ranking objective (only the order of
  candidates matters, so tasks of different speed share a model), retrained after every round on
  everything the task measured; transfer = a booster trained on the other tasks' pools that the task's own
  measurements continue (extra trees) instead of being drowned in.
"""

from __future__ import annotations

import copy
import types
from typing import List, Optional, Sequence

import numpy as np

from .pool_file import Pool

FAILED_COST_SECS = 1e10  # what XGBModel assigns a candidate without run times


def store_rows(pool: Pool, i: int, expert: bool) -> np.ndarray:
    rows = pool.store_features(i)
    if not expert:
        return rows
    extra = np.broadcast_to(pool.expert_features[i], (rows.shape[0], pool.expert_features.shape[1]))
    return np.concatenate([rows, extra], axis=1)


def _group_key(pool: Pool):
    """A TuneContext stand-in: XGBModel groups (and normalises) data by a structural hash of ``context.mod``."""
    import tvm

    return types.SimpleNamespace(mod=tvm.IRModule({}).with_attr("tfx.pool", pool.name))


class _Lookup:
    """Feature extractor returning the stored rows of pool candidates (candidates are pool indices)."""

    def __init__(self, expert: bool):
        self.expert = expert
        self.pools = {}

    def extract_from(self, context, candidates):
        pool = self.pools[str(context.mod.attrs["tfx.pool"])]
        return [types.SimpleNamespace(numpy=lambda i=i: store_rows(pool, int(i), self.expert)) for i in candidates]


def _results(pool: Pool, idx: Sequence[int]):
    out = []
    for i in idx:
        secs = pool.run_us[i]
        ok = np.isfinite(pool.latency_us[i])
        out.append(types.SimpleNamespace(run_secs=[float(s) * 1e-6 for s in secs if np.isfinite(s)] if ok else None))
    return out


class MetaScheduleXGB:
    """MetaSchedule's ``XGBModel`` (the Python implementation behind the FFI object), offline."""

    def __init__(self, pool: Pool, expert_features: bool = False, warmup: int = 8, threads: int = 1):
        from tvm.s_tir import meta_schedule as ms

        self.pool = pool
        outer = ms.cost_model.XGBModel(num_warmup_samples=warmup, num_tuning_cores=threads, verbose_eval=10**9)
        self.model = outer._inst  # noqa: SLF001  (the Python object; the FFI wrapper takes only FFI types)
        self._outer = outer
        self.lookup = _Lookup(expert_features)
        self.lookup.pools[pool.name] = pool
        self.model.extractor = self.lookup
        self.context = _group_key(pool)

    def pretrain(self, others: List[Pool]) -> None:
        """Train once on every candidate of ``others`` (what ``warm_start.py`` does with record directories)."""
        usable = [p for p in others if len(p)]
        for n, other in enumerate(usable):
            self.lookup.pools[other.name] = other
            # one training at the end, not one per pool (warm_start.py: same trick)
            self.model.last_train_size = 0 if n == len(usable) - 1 else 2**62
            self.model.update(_group_key(other), list(range(len(other))), _results(other, range(len(other))))

    def clone_for(self, pool: Pool) -> "MetaScheduleXGB":
        twin = copy.copy(self)
        twin.model = copy.copy(self.model)
        twin.model.data = copy.deepcopy(self.model.data)
        twin.model.booster = None if self.model.booster is None else self.model.booster.copy()
        twin.lookup = copy.copy(self.lookup)
        twin.lookup.pools = dict(self.lookup.pools, **{pool.name: pool})
        twin.model.extractor = twin.lookup
        twin.pool, twin.context = pool, _group_key(pool)
        return twin

    def observe(self, idx: Sequence[int]) -> None:
        self.model.update(self.context, [int(i) for i in idx], _results(self.pool, idx))

    def score(self, idx: Sequence[int], seed: int) -> np.ndarray:
        # before warm-up XGBModel draws np.random.uniform: seeded here so a replay is deterministic
        np.random.seed(seed % 2**32)
        return np.asarray(self.model.predict(self.context, [int(i) for i in idx]), dtype=np.float64)


# ----------------------------------------------------------------------------------------------- ours

def candidate_rows(pool: Pool, expert: bool = True, store: bool = True, knobs: bool = False) -> np.ndarray:
    """One feature row per candidate: per-store rows summed and maxed (``store``), the expert features
    (``expert``) and the trace's decisions (``knobs``, ``knob_features.py``)."""
    parts = []
    if store:
        sums = np.add.reduceat(pool.feature_rows[pool.feature_index], pool.feature_offsets[:-1], axis=0) \
            if len(pool.feature_index) else np.zeros((len(pool), pool.feature_rows.shape[1]), np.float32)
        maxes = np.maximum.reduceat(pool.feature_rows[pool.feature_index], pool.feature_offsets[:-1], axis=0) \
            if len(pool.feature_index) else sums
        empty = pool.feature_offsets[1:] == pool.feature_offsets[:-1]
        sums[empty] = 0
        maxes[empty] = 0
        parts += [sums, maxes]
    if expert:
        parts.append(pool.expert_features)
    if knobs:
        from ...tune.knob_features import knob_rows

        parts.append(knob_rows(_traces(pool)))
    if not parts:
        return np.zeros((len(pool), 0), np.float32)
    return np.concatenate(parts, axis=1).astype(np.float32)


def _traces(pool: Pool) -> list:
    if pool.traces is None:
        if not pool.path:
            raise ValueError(f"pool {pool.name} has no traces to read knobs from")
        from .pool_file import load

        pool.traces = load(pool.path, traces=True).traces
    return pool.traces


class RankXGB:
    """Pairwise-ranking XGBoost on per-candidate rows, retrained on all of the task's data every round."""

    from ...tune.rank_model import PARAMS  # the tuner's RankModel learns with the same settings

    def __init__(self, pool: Pool, expert_features: bool = True, rounds: int = 60, pretrain_rounds: int = 200,
                 params: tuple = (), store: bool = True, knobs: bool = False):
        self.params = {**self.PARAMS, **dict(params)}
        self.pool = pool
        self.expert = expert_features
        self.columns = {"expert": expert_features, "store": store, "knobs": knobs}
        self.rows = candidate_rows(pool, **self.columns)
        self.rounds, self.pretrain_rounds = rounds, pretrain_rounds
        self.base = None          # booster trained on other tasks' pools
        self.booster = None
        self.seen: List[int] = []

    def pretrain(self, others: List[Pool]) -> None:
        xs, ys, groups = [], [], []
        for other in others:
            ok = np.flatnonzero(np.isfinite(other.latency_us))
            if len(ok) < 2:
                continue
            xs.append(candidate_rows(other, **self.columns)[ok])
            ys.append(_relevance(other.latency_us[ok]))
            groups.append(len(ok))
        from ...tune.rank_model import train_ranker

        self.base = train_ranker(xs, ys, groups, self.params, self.pretrain_rounds)

    def clone_for(self, pool: Pool) -> "RankXGB":
        twin = RankXGB.__new__(RankXGB)
        twin.__dict__.update(self.__dict__)
        twin.pool, twin.rows = pool, candidate_rows(pool, **self.columns)
        twin.booster, twin.seen = None, []
        return twin

    def observe(self, idx: Sequence[int]) -> None:
        self.seen.extend(int(i) for i in idx)
        seen = np.asarray(self.seen)
        lat = self.pool.latency_us[seen]
        # a failed candidate ranks below every measured one
        worst = np.nanmax(lat) * 10 if np.isfinite(lat).any() else 1.0
        lat = np.where(np.isfinite(lat), lat, worst)
        if len(seen) < 2 or np.ptp(lat) == 0:
            return
        from ...tune.rank_model import train_ranker

        self.booster = train_ranker([self.rows[seen]], [_relevance(lat)], [len(seen)], self.params, self.rounds,
                                    self.base)

    def score(self, idx: Sequence[int], seed: int) -> Optional[np.ndarray]:
        from ...tune.rank_model import ranker_margins

        if self.booster is None and self.base is None:
            return None
        return ranker_margins(self.rows[np.asarray(idx)], self.base, self.booster)


def _relevance(latency: np.ndarray) -> np.ndarray:
    """Ranking labels: normalised throughput (best of the group = 1), as XGBModel's regression target."""
    return (np.min(latency) / latency).astype(np.float32)


# ----------------------------------------------------------------------------------------------- handover

class Handover:
    """One model picks until ``at`` trials are measured, another after; both learn from every measurement.

    What it is for (BERT's FFN ``auto`` pool): ``rank-knobs-transfer`` reaches a near-best candidate in a few
    rounds and then keeps picking next to it, while MetaSchedule's ``XGBModel`` pre-trained on the other pools
    (``xgb-transfer``) is slower to get near but goes on to the pool's best. The first model buys the early
    trials, the second the final best."""

    def __init__(self, first, then, at: int):
        self.first, self.then, self.at = first, then, int(at)
        self.measured = 0

    def clone_for(self, pool: Pool) -> "Handover":
        return Handover(self.first.clone_for(pool), self.then.clone_for(pool), self.at)

    def observe(self, idx: Sequence[int]) -> None:
        self.measured += len(idx)
        self.first.observe(idx)
        self.then.observe(idx)

    def score(self, idx: Sequence[int], seed: int) -> Optional[np.ndarray]:
        return (self.first if self.measured < self.at else self.then).score(idx, seed)
