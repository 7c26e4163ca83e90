"""The runtime-only floor: what running a compiled model needs, and nothing that compiles.

Everything here imports ``tvm.runtime`` and numpy only, so it works where TVM runs runtime-only
(``libtvm_compiler.so`` absent, or ``TVM_USE_RUNTIME_LIB=1``).
"""
