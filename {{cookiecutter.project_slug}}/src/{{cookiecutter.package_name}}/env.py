"""Report the software and accelerators this environment has: python -m {{ cookiecutter.package_name }}.env

Run it first when training will not start, is slow, or ignores the GPU.
"""

import platform
import sys

import lightning
import torch
import torchvision


def report() -> list[str]:
    """Versions, accelerators, and a warning for a CUDA build of torch that finds no GPU."""
    cuda_build = torch.version.cuda
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    lines = [
        f"Python       {platform.python_version()} ({sys.executable})",
        f"torch        {torch.__version__}",
        f"lightning    {lightning.__version__}",
        f"torchvision  {torchvision.__version__}",
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


if __name__ == "__main__":
    print("\n".join(report()))
