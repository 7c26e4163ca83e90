"""CUDA kernels checked on a GPU machine that has no TVM compiler: the numerics part of the GPU campaign alone
(:mod:`tvm_fusion_ext.tools.gpu_campaign.numerics`; ``python -m tvm_fusion_ext.tools.gpu_campaign`` runs every part).

    python scripts/gpu_check.py build DIR [--arch sm_90]           # here: nvcc, numpy references
    PYTHONPATH=$PWD/.devrt/site python scripts/gpu_check.py run DIR --json OUT.json   # there: tvm.runtime + torch
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tvm_fusion_ext.tools.gpu_campaign.numerics import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
