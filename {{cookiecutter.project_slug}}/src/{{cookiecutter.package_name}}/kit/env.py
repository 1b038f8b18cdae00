"""Report the software and accelerators this environment has (`python -m <package>.env`).

Run it first when training will not start, is slow, or ignores the GPU.
"""

import platform
import sys
from importlib import metadata

import lightning
import torch


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def report(extra: tuple[str, ...] = ()) -> list[str]:
    """Versions (the project's own `extra` distributions too), accelerators, and a warning for
    a CUDA build of torch that finds no GPU."""
    cuda_build = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines = [
        f"Python       {platform.python_version()} ({sys.executable})",
        f"torch        {torch.__version__}",
        f"lightning    {lightning.__version__}",
        *(f"{name:<13}{version(name)}" for name in extra),
        f"CUDA build   {cuda_build or 'none (a CPU-only build of torch)'}",
        f"cuDNN        {cudnn or 'none'}",
        f"GPUs         {gpus}",
        *(f"  cuda:{i}     {torch.cuda.get_device_name(i)}" for i in range(gpus)),
        f"MPS (Apple)  {'available' if torch.backends.mps.is_available() else 'not available'}",
        f"CPU threads  {torch.get_num_threads()}",
    ]
    if cuda_build and not gpus:
        lines.append(
            f"warning: this torch is built for CUDA {cuda_build} but finds no usable GPU: check "
            "`nvidia-smi`, the driver version against the CUDA build, and CUDA_VISIBLE_DEVICES; "
            "training runs on the CPU until then"
        )
    return lines


def main(extra: tuple[str, ...] = ()) -> None:
    print("\n".join(report(extra)))
