"""``precision: auto``: bf16 where the hardware computes it natively, else full fp32.

bf16 autocast on a CPU without AVX512-BF16 / AMX is emulated and slower than fp32; on a GPU it needs
Ampere or newer. The choice is made by the trainer on the machine that trains (a pod's node, not the
Dagster process) and recorded in the run's MLflow params and ``metrics.json``.
Measured effect on speed and quality: benchmarks/results/defaults.json.
"""

from __future__ import annotations

import torch


def cpu_supports_bf16() -> bool:
    """AVX512-BF16 or AMX (Intel Sapphire Rapids+, AMD Zen 4+): what makes CPU bf16 faster, not
    just smaller.
    """
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def resolve_precision(precision: str, accelerator: str) -> str:
    """The Lightning precision a run uses: ``auto`` decided for this machine, ``32`` spelled
    ``32-true``.
    """
    if precision == "auto":
        gpu = accelerator != "cpu" and torch.cuda.is_available()
        if gpu:
            return "bf16-mixed" if torch.cuda.is_bf16_supported() else "32-true"
        return "bf16-mixed" if cpu_supports_bf16() else "32-true"
    return "32-true" if precision == "32" else precision
