"""What :func:`~tvm_fusion_ext.compile.finalize.finalize` adds around TVM's code generation (CPU weight
prefetch, parallel loops kept serial for small calls, shape values computed once, ``noalias`` shape functions), and the weights an artifact lifts out of
the module before it (:mod:`.weights`)."""
