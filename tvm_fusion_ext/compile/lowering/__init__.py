"""The passes :func:`~tvm_fusion_ext.compile.lower.lower` runs around TVM's legalize/fuse passes, one per
module; the table in :mod:`tvm_fusion_ext.compile` lists them, and ``lower`` says their order."""
