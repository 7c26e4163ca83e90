"""``HandoverModel``: the tuner's cost model for ``tvm-fusion tune --cost-model handover``.

Two models behind one ``PyCostModel``: ``RankModel`` (``rank_model.py``) picks a kernel's candidates until
``at`` of that kernel's trials are measured, MetaSchedule's ``XGBModel`` picks them after; both learn from
every measurement, and from ``--warm-start`` records (the ranker as a fixed base it continues, XGBModel on the
records pooled with the run's own, as each does alone).

Why (docs/tuning-lab.md, "Replay", the ``handover-transfer`` strategy): pre-trained on another model's pools of the same
kernel, the ranker reaches a near-best schedule within a few rounds and then keeps picking next to it; on BERT's
FFN ``auto`` pool it stopped at the third-best candidate in every seed. ``XGBModel`` pre-trained the same way is
slower to get near but goes on to the pool's best. Handing over after 64 trials keeps the first's speed and
the second's final best (after 32, the template FFN pool lost the template's best in 8 of 50 seeds: the ranker
had not reached it yet).
"""

from __future__ import annotations

import os
from typing import Dict

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

#: trials of a kernel picked by the ranker before XGBModel takes over (the replay's ``handover-transfer``)
HANDOVER_AT = 64


@derived_object
class HandoverModel(PyCostModel):
    """``first`` predicts a kernel's candidates until ``at`` of its trials are measured, ``then`` after."""

    def __init__(self, first, then, at: int = HANDOVER_AT):
        super().__init__()
        # the Python objects behind the derived-object wrappers: called directly, not through the FFI
        self.first, self.then = getattr(first, "_inst", first), getattr(then, "_inst", then)
        self.at = int(at)
        self.measured: Dict[int, int] = {}  # structural hash of a kernel -> its trials measured (records included)

    @property
    def last_train_size(self) -> int:
        return self.first.last_train_size

    @last_train_size.setter
    def last_train_size(self, value: int) -> None:
        # warm_start.py defers training to the last kernel's records this way: both parts must hear it
        self.first.last_train_size = value
        self.then.last_train_size = value

    # what the progress report reads to tell predictions from warm-up noise (tune/progress.py)
    @property
    def booster(self):
        return self.first.booster if self.first.booster is not None else self.then.booster

    @property
    def data_size(self) -> int:
        return self.first.data_size

    @property
    def num_warmup_samples(self) -> int:
        return self.first.num_warmup_samples

    def freeze_as_base(self) -> None:
        """The ranker makes the records a fixed base (its transfer); XGBModel keeps them as training data."""
        self.first.freeze_as_base()

    def load(self, path: str) -> None:
        self.first.load(os.path.join(path, "rank.pkl"))
        self.then.load(os.path.join(path, "xgb"))

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.first.save(os.path.join(path, "rank.pkl"))
        self.then.save(os.path.join(path, "xgb"))

    def update(self, context, candidates, results) -> None:
        import tvm_ffi

        key = int(tvm_ffi.structural_hash(context.mod))
        self.measured[key] = self.measured.get(key, 0) + len(candidates)
        self.first.update(context, candidates, results)
        self.then.update(context, candidates, results)

    def picker(self, context):
        """The model that predicts ``context``'s kernel now."""
        import tvm_ffi

        measured = self.measured.get(int(tvm_ffi.structural_hash(context.mod)), 0)
        return self.first if measured < self.at else self.then

    def predict(self, context, candidates):
        return self.picker(context).predict(context, candidates)
