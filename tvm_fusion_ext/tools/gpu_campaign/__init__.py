"""The GPU campaign: everything a rare, short GPU loan should measure, built here and run there in one go.

    python -m tvm_fusion_ext.tools.gpu_campaign build DIR --arch sm_90 [--parts numerics,dense,...]   # here, nvcc
    TVM_USE_RUNTIME_LIB=1 PYTHONPATH=$PWD/.devrt/site:$PWD \\
        python -m tvm_fusion_ext.tools.gpu_campaign run DIR [--parts ...] [--json OUT.json]          # there

Parts (each runnable alone; ``run`` prints the expected time of each before it starts):

``numerics``   every CUDA template against numpy (:mod:`.numerics`, what ``scripts/gpu_check.py`` runs),
               16-bit attention both through the SIMT and the opt-in tensor-core template
``dense``      fp16 dense at BERT-base / LLaMA-7B projection sizes vs cuBLAS (:mod:`.speed`)
``attention``  fp16 attention S = 512…8192, head dim 64/128, causal and not, vs SDPA
``norms``      LayerNorm / RMSNorm vs torch
``decode``     fp16 split-K decode attention, one query row, P = 512…8192 keys, batch 1 / 8, 32 heads on 8 K/V heads
               of 128, vs SDPA with one query row
``e2e``        BERT-base and a LLaMA-shaped prefill in fp16, symbolic-shape and static builds, vs the same model in
               plain torch fp16 eager (and torch.compile), weights drawn there from a seed (:mod:`.e2e`)
``pool``       template candidates of heavy kernels timed there (:mod:`.pool`); ``pool-pack`` (here, after the run)
               turns the times into pool files for ``tuning_lab replay`` and records for ``--warm-start``

``build`` adds parts to a campaign directory already built for the same arch and prints, per part, files, MiB and
expected time there, and the total carried with the runtime bundle and the checkout against the 64 MiB limit (over
it, one line and exit status 1).

``build --arch llvm`` makes the same campaign for this CPU (float32 numerics, small speed cases with ``--quick``):
the run side then executes here under a runtime-only TVM, so the first GPU run is not the first run.
The run side imports only ``tvm.runtime``, numpy and torch (:mod:`.device`, :mod:`.numerics`'s run, :mod:`.speed`'s
run). Inputs, and the e2e part's weights, are generated there from seeds (the numerics part's small ones are
carried); libraries are small (no weights) and travel gzipped (:mod:`.carry`), unpacked by ``run``.
"""
