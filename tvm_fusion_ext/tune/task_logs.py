"""Per-task log files under ``<logs>/logs/``, without touching the process's logging configuration.

MetaSchedule's own ``get_loggers_from_work_dir`` calls ``logging.config.dictConfig``, which closes every
handler in the process (the embedding application's included) and crashes with ``'NoneType' object has no
attribute 'format'`` as soon as anything attached an unnamed handler to the ``tvm.s_tir.meta_schedule``
logger (pytest and notebooks both can). A library must not do either, so each task gets a plain logger
with one file handler of its own, removed again when tuning ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from typing import Iterator, List

_FORMAT = logging.Formatter("%(asctime)s [%(levelname)s] %(message)s", "%Y-%m-%d %H:%M:%S")


def _file_name(index: int, width: int, task_name: str) -> str:
    # task names are PrimFunc names; keep the file name portable and short
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", task_name)[:100]
    return f"task_{index:0{width}d}_{safe}"


@contextlib.contextmanager
def task_loggers(work_dir: str, task_names: List[str]) -> Iterator[List[logging.Logger]]:
    """Yield one logger per task, each writing ``<work_dir>/logs/task_<i>_<name>.log``; detach them on exit."""
    log_dir = os.path.join(work_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    width = len(str(max(0, len(task_names) - 1)))
    loggers, handlers = [], []
    try:
        for i, name in enumerate(task_names):
            stem = _file_name(i, width, name)
            logger = logging.getLogger(f"tvm_fusion_ext.tune.{stem}")
            logger.setLevel(logging.DEBUG)
            logger.propagate = False  # task chatter belongs in its file, not on the user's console
            handler = logging.FileHandler(os.path.join(log_dir, stem + ".log"), mode="a")
            handler.setFormatter(_FORMAT)
            logger.addHandler(handler)
            loggers.append(logger)
            handlers.append((logger, handler))
        yield loggers
    finally:
        for logger, handler in handlers:
            logger.removeHandler(handler)
            handler.close()
