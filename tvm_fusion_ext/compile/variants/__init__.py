"""Run-time kernel variants :func:`~tvm_fusion_ext.compile.schedule.schedule` adds to scheduled CPU kernels: a
kernel's branches for short or long requests, chosen on its own symbolic sizes, and causal key loops bounded
by their query tile. The Relax graph, the tuner's tasks and the records are unchanged (:mod:`.branches`)."""
