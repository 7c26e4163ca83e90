"""The tuning lab: research tools over the tuner, above the library (nothing in ``tvm_fusion_ext`` imports it).

``python -m tvm_fusion_ext.tools.tuning_lab pool|replay|compare ...``

* ``pool``: candidate pools, each candidate of a task's design space measured once (``pool_cli.py``:
  ``collect.py`` draws and measures, ``pool_file.py`` is the ``tuning_pools/*.npz`` format, ``pool_remeasure.py``,
  ``pool_refeature.py``, ``pool_records.py`` rework a pool file, ``pool_tasks.py`` names the kernels);
* ``replay``: search strategies replayed over the pools without measurement noise (``replay.py``, with the
  offline cost models in ``replay_models.py`` and the noise test in ``replay_noise.py``);
* ``compare``: model-guided against random search, measured, on one model (``compare.py``).

Imports go one way: ``__main__`` → ``pool_cli`` / ``replay`` / ``compare`` → ``pool_remeasure`` →
``pool_refeature`` / ``pool_records`` / ``replay_models`` → ``pool_file`` → ``collect`` → ``pool_tasks`` → the
tuner's public names (``tvm_fusion_ext.tune``).
"""
