"""``RankModel``: the tuner's ranking cost model (``tvm-fusion tune --cost-model rank``).

MetaSchedule's ``XGBModel`` regresses each measured store's share of a normalised throughput (pack-sum over
per-store rows). Evolutionary search only ever asks a cost model which candidates to measure next, so only
the *order* of its predictions matters. This model learns that order directly:

* one row per candidate: the trace's decisions (``knob_features.py``) and the expert features
  (``expert_features.py``: parallel extent against cores, vector alignment, register tile, cache traffic
  against L1/L2, unrolling); optionally its ``PerStoreFeature`` rows summed (what pack-sum adds up) and their
  maximum (the heaviest store, which pack-sum cannot see). Which columns, and trees of depth 3, is what the
  replay benchmark chose (docs/tuning-lab.md, "Replay");
* XGBoost with a pairwise ranking objective, one ranking group per kernel, so kernels of different speed
  (and records of other models, ``--warm-start``) share one model without a common latency scale;
* a candidate's cost is its fastest repeat (other processes only ever slow a kernel down);
* retrained from scratch after every batch of measurements (a tuning run has at most a few thousand rows;
  training takes well under a second).

The replay benchmark (``tools/tuning_lab/replay.py``, strategies ``rank*``) runs the same learner over pre-measured
pools; ``tools/tuning_lab/replay_models.py::RankXGB`` is that offline twin.
"""

from __future__ import annotations

import pickle
import sys
from typing import Dict, List, Optional

import numpy as np
from tvm.s_tir.meta_schedule.cost_model import PyCostModel
from tvm.ir.utils import derived_object

FAILED_COST = 1e10
# the columns and tree depth of the replay's winning ranking strategy (docs/tuning-lab.md, "Replay"): rank-knobs
STORE_FEATURES, KNOB_FEATURES, MAX_DEPTH = False, True, 3
# eta 0.1: a model retrained on at most a few hundred candidates, or continuing a booster pre-trained on another
# task, overfits at 0.2 (replay, rank-knobs-transfer, trials to random's final best at 0.2 -> 0.1: BERT FFN
# 51.5 -> 15, MiniLM FFN template 27 -> 17, MiniLM FFN auto 25 -> 12, MiniLM attention 2 -> 6)
PARAMS = {"objective": "rank:pairwise", "max_depth": 6, "eta": 0.1, "subsample": 1.0, "min_child_weight": 1,
          "lambda": 1.0, "nthread": 1, "seed": 43, "tree_method": "hist"}


def candidate_row(store_rows: Optional[np.ndarray], expert: Optional[np.ndarray],
                  knobs: Optional[np.ndarray] = None) -> np.ndarray:
    """One candidate's model row: its per-store feature rows (``[stores, 164]``) summed and maxed, its expert
    features, its knob features; each part only if given."""
    parts = []
    if store_rows is not None:
        width = store_rows.shape[1] if store_rows.ndim == 2 and store_rows.shape[1] else 164
        if store_rows.size:
            parts += [store_rows.sum(axis=0), store_rows.max(axis=0)]
        else:
            parts += [np.zeros(width, np.float32), np.zeros(width, np.float32)]
    for extra in (expert, knobs):
        if extra is not None:
            parts.append(np.asarray(extra, np.float32))
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def relevance(costs: np.ndarray) -> np.ndarray:
    """Ranking labels within one kernel: normalised throughput (best = 1); failures rank below all."""
    costs = np.asarray(costs, np.float64)
    ok = costs < FAILED_COST
    if not ok.any():
        return np.zeros(len(costs), np.float32)
    best = costs[ok].min()
    return np.where(ok, best / np.where(ok, costs, 1.0), 0.0).astype(np.float32)


def train_ranker(xs, ys, sizes, params: dict, rounds: int, base=None):
    """A pairwise-ranking booster over groups of rows (one group per kernel); None without data. With ``base``
    (a booster trained on other tasks) the new trees continue its margins instead of starting from zero."""
    import xgboost as xgb

    if not xs:
        return None
    rows = np.concatenate(xs)
    d = xgb.DMatrix(rows, label=np.concatenate(ys))
    d.set_group(sizes)
    if base is not None:
        d.set_base_margin(base.predict(xgb.DMatrix(rows), output_margin=True))
    return xgb.train(params, d, num_boost_round=rounds)


def ranker_margins(rows: np.ndarray, base=None, booster=None) -> np.ndarray:
    """Ranking margins of ``rows``: the base's, continued by ``booster``'s trees when there is one."""
    import xgboost as xgb

    d = xgb.DMatrix(rows)
    margins = base.predict(d, output_margin=True) if base is not None else None
    if booster is not None:
        if margins is not None:
            d.set_base_margin(margins)
        margins = booster.predict(d, output_margin=True)
    return np.asarray(margins, dtype=np.float64)


def positive_scores(margins) -> np.ndarray:
    """Ranking margins as scores in (0, 1], in the same order: the best candidate of the batch 1, the worst 1/n.

    Evolutionary search clips every score below 0 to 0 and then samples the next generation's parents in
    proportion to the scores; raw pairwise-ranking margins are often negative, which would leave it choosing
    among zeros. Ranks keep the order (all that top-k selection reads) and give better candidates proportionally
    more offspring, as XGBModel's normalised throughputs do."""
    margins = np.asarray(margins, dtype=np.float64)
    order = np.argsort(np.argsort(margins, kind="stable"), kind="stable")
    return (order + 1.0) / max(1, len(margins))


@derived_object
class RankModel(PyCostModel):
    """Pairwise-ranking XGBoost over one row per candidate, one ranking group per kernel."""

    def __init__(self, target=None, expert_features: bool = True, rounds: int = 60, num_warmup_samples: int = 8,
                 seed: int = 0, store_features: bool = STORE_FEATURES, knob_features: bool = KNOB_FEATURES,
                 max_depth: int = MAX_DEPTH, pretrain_rounds: int = 200):
        from tvm.s_tir import meta_schedule as ms

        super().__init__()
        self.target = target
        self.expert = expert_features and target is not None
        self.store, self.knobs = store_features, knob_features
        self.params = dict(PARAMS, max_depth=max_depth)
        self.rounds = rounds
        self.num_warmup_samples = num_warmup_samples
        self.extractor = ms.feature_extractor.PerStoreFeature()
        self.groups: Dict[int, tuple] = {}     # structural hash of the kernel -> (rows list, costs list)
        self.booster = None
        #: a booster trained on other tasks' records (``--warm-start``, :meth:`freeze_as_base`): fixed; this
        #: run's trees continue its margins, as the replay's ``-transfer`` strategies do
        self.base = None
        self.pretrain_rounds = pretrain_rounds
        self.data_size = 0
        self.last_train_size = 0               # warm_start.py sets it huge to defer training to the last kernel
        self.rng = np.random.default_rng(seed)
        self._machine = None

    # -------------------------------------------------------------------------------------------- features
    def _rows(self, context, candidates) -> np.ndarray:
        n = len(candidates)
        stores = [f.numpy().astype(np.float32) for f in self.extractor.extract_from(context, candidates)] \
            if self.store else [None] * n
        experts = self._expert(candidates) if self.expert else [None] * n
        knobs = [self._knobs(c) for c in candidates] if self.knobs else [None] * n
        return np.stack([candidate_row(*parts) for parts in zip(stores, experts, knobs)]) if n else \
            np.zeros((0, 0), np.float32)

    @staticmethod
    def _knobs(candidate) -> np.ndarray:
        from .knob_features import knob_row, trace_json

        return knob_row(trace_json(candidate.sch.trace))

    def _expert(self, candidates) -> List[np.ndarray]:
        from .expert_features import FEATURE_NAMES, candidate_features, machine_of

        if self._machine is None:
            self._machine = machine_of(self.target)
        out = []
        for cand in candidates:
            try:
                out.append(np.asarray(candidate_features(cand.sch.mod, self.target, self._machine), np.float32))
            except Exception:  # noqa: BLE001  (a kernel the IR walk does not understand: neutral features)
                out.append(np.zeros(len(FEATURE_NAMES), np.float32))
        return out

    # -------------------------------------------------------------------------------------------- PyCostModel
    def load(self, path: str) -> None:
        with open(path, "rb") as f:
            state = pickle.load(f)
        self.groups, self.booster, self.data_size = state[:3]
        self.base = state[3] if len(state) > 3 else None

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            pickle.dump((self.groups, self.booster, self.data_size, self.base), f)

    def freeze_as_base(self) -> None:
        """What the model was fed so far (other tasks' records) becomes a fixed base booster; this run then
        learns from its own measurements only, on top of the base's margins. Trained jointly instead, the other
        tasks' hundreds of records outweigh the few of this task. The replay's ``rank-knobs-transfer`` continues
        a base the same way (docs/tuning-lab.md, "Replay")."""
        xs, ys, sizes = self._training_data()
        self.base = train_ranker(xs, ys, sizes, self.params, self.pretrain_rounds) or self.base
        self.groups, self.booster, self.data_size = {}, None, 0
        self.last_train_size = 0

    def update(self, context, candidates, results) -> None:
        import tvm_ffi

        if not candidates:
            return
        key = int(tvm_ffi.structural_hash(context.mod))
        rows = self._rows(context, candidates)
        # the fastest repeat: on a shared machine interference only ever slows a run down
        costs = [min(float(s) for s in r.run_secs) if r.run_secs else FAILED_COST for r in results]
        group = self.groups.setdefault(key, ([], []))
        group[0].extend(rows)
        group[1].extend(costs)
        self.data_size += len(costs)
        if self.last_train_size >= sys.maxsize:
            return
        self.last_train_size = self.data_size
        self._train()

    def _training_data(self):
        xs, ys, sizes = [], [], []
        for rows, costs in self.groups.values():
            if len(costs) < 2 or len(set(costs)) < 2:
                continue  # a kernel with one measurement (or all equal) orders nothing
            xs.append(np.stack(rows))
            ys.append(relevance(np.asarray(costs)))
            sizes.append(len(costs))
        return xs, ys, sizes

    def _train(self) -> None:
        xs, ys, sizes = self._training_data()
        self.booster = train_ranker(xs, ys, sizes, self.params, self.rounds, self.base) or self.booster

    def predict(self, context, candidates) -> np.ndarray:
        own = self.booster is not None and self.data_size >= self.num_warmup_samples
        if not candidates or (not own and self.base is None):
            return self.rng.uniform(0, 1, len(candidates)).astype(np.float64)
        return positive_scores(ranker_margins(self._rows(context, candidates), self.base,
                                              self.booster if own else None))
