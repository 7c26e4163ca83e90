"""Tools above the library: benchmarks against the peers, the demo, the CUDA resource report, the tuning lab
(``tuning_lab``: candidate pools, search replay, search comparison).

Nothing in the library imports from here; the CLI (:mod:`tvm_fusion_ext.cli`) and users do.
"""
