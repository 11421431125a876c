"""``python -m finetune_assets.core.training.cuda_preflight``: a pod given GPUs refuses to start
without CUDA.

Why: the trainer falls back to gloo on CPU when CUDA is missing
(``core/training/process_group.py``),
so a CPU image, or a GPU image whose loader cannot find the node's driver, would train for hours
on CPU while the gang holds its GPUs. The launcher runs this before torchrun in every pod that
requests ``nvidia.com/gpu`` (``cuda_preflight``): it asks the driver itself (``libcuda.so.1``:
``cuInit`` + ``cuDeviceGetCount``; no torch import, so it costs milliseconds) and exits with
:data:`EX_CONFIG` (78) and a message naming the image and the driver path. 78 is a configuration
error in the failure table (``core/launchers/k8s/failures.py``): the run fails at once, no retry.

Stdlib only; no Dagster, no torch.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

EX_CONFIG = 78  # sysexits.h: configuration error
EXPECT_ENV = "FINETUNE_EXPECT_GPUS"
IMAGE_ENV = "FINETUNE_IMAGE"
DRIVER_PATH_ENV = "FINETUNE_NVIDIA_DRIVER_PATH"
MARK = "CUDA preflight failed"


def cuda_devices() -> tuple[int, str]:
    """(devices the driver reports, why none when 0)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return 0, f"libcuda.so.1 (the NVIDIA driver library) cannot be loaded: {e}"
    rc = lib.cuInit(0)
    if rc != 0:
        return 0, f"cuInit failed with CUresult {rc} (no device visible, or driver mismatch)"
    count = ctypes.c_int(0)
    rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0:
        return 0, f"cuDeviceGetCount failed with CUresult {rc}"
    return count.value, "" if count.value else "the driver reports 0 devices"


def main() -> int:
    expected = int(os.environ.get(EXPECT_ENV) or 0)
    if expected <= 0:
        return 0
    found, why = cuda_devices()
    if found >= expected:
        return 0
    driver = os.environ.get(DRIVER_PATH_ENV, "/usr/local/nvidia/lib64")
    nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
    print(
        f"{MARK}: this pod was given {expected} GPU(s) (nvidia.com/gpu) but CUDA sees {found}: "
        f"{why}. Image: {os.environ.get(IMAGE_ENV) or '?'} (must be the GPU build: "
        "deploy/Dockerfile with TORCH_INDEX=.../cu126, tagged -cu126); driver path: "
        f"{driver} (on LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')!r}; GKE mounts the "
        "driver there, the NVIDIA container toolkit elsewhere injects it into /usr/lib); device "
        f"nodes: {nodes or 'none'}. Refusing to train on CPU while the GPUs sit reserved "
        "(a configuration error: not retried).",
        file=sys.stderr,
        flush=True,
    )
    return EX_CONFIG


if __name__ == "__main__":
    sys.exit(main())
