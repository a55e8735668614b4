"""``python -m torchdefer``: what this installation of torchdefer is, for bug reports.

Prints the version, where the package was imported from, the torch it was compiled against and
the one running, the instruction set the counter RNG fills CPU tensors with on this machine, and
whether the CUDA counter fill is compiled in (the build's torch had CUDA and nvcc was found).
"""

from __future__ import annotations

import os
from typing import List, Tuple

import torch

import torchdefer
from torchdefer import _C
from torchdefer._build_info import TORCH_VERSION


def report() -> List[Tuple[str, str]]:
    """(label, value) for each line ``python -m torchdefer`` prints."""
    return [
        ("torchdefer", torchdefer.__version__),
        ("location", os.path.dirname(os.path.abspath(torchdefer.__file__))),
        ("built against torch", TORCH_VERSION),
        ("running torch", torch.__version__),
        ("counter fill CPU capability", _C.counter_fill_cpu_capability()),
        ("counter scheme", str(_C.counter_scheme_version())),
        ("CUDA kernels", "yes" if _C.has_cuda_kernels() else "no"),
        ("CUDA available", "yes" if torch.cuda.is_available() else "no"),
    ]


def main() -> None:
    lines = report()
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        print(f"{label + ':':<{width + 1}} {value}")


if __name__ == "__main__":
    main()
