"""What a ``trunc_normal_`` given a seeded ``torch.Generator`` costs to record, and what the first
read of that generator costs afterwards (Note [Followed generators] in
recorder/internal/torchdefer/followed_generator.h), next to eager construction.

One 4096 x 4096 parameter with ``trunc_normal_(std=0.02, generator=g)``, three repetitions after a
warm-up recording (torch's first-use imports):

    PYTHONPATH=build/python python3 bench/followed_generator_cost.py
"""

from __future__ import annotations

import time

import torch
import torchdefer
from torch import nn


class Weight(nn.Module):
    def __init__(self, g: torch.Generator) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.empty(4096, 4096))
        nn.init.trunc_normal_(self.w, std=0.02, generator=g)


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    torchdefer.deferred_init(Weight, torch.Generator().manual_seed(0))
    for _ in range(3):
        eager = seconds(lambda: Weight(torch.Generator().manual_seed(1)))
        g = torch.Generator().manual_seed(1)
        record = seconds(lambda: torchdefer.deferred_init(Weight, g))
        first_read = seconds(g.get_state)
        print(f"eager {eager:.3f} s, deferred_init {record * 1e3:.2f} ms, first g.get_state() {first_read:.3f} s")


if __name__ == "__main__":
    main()
