"""What handing out the fakes computed after deferred_init returned costs (Note [Fakes computed after
deferred_init returned] in bindings/torchdefer/_stand_ins.py).

A torchtitan-style Llama-70B (80 layers, dim 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256)
is recorded, then its ``init_weights()`` (``trunc_normal_`` on every weight, ``ones_`` on every norm,
``normal_`` on the embedding) runs on the handed-out fakes, with the result check and without it
(results left plain, the behaviour before), interleaved in one process. Then the per-call figures:
a recorded op on a handed-out fake, a call returning no tensor (``p.shape``), and the check alone.

    PYTHONPATH=build/python python3 bench/after_return_cost.py
"""

from __future__ import annotations

import time
import timeit

import torch
import torchdefer
from torch import nn
from torchdefer import _stand_ins

DIM, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 8192, 80, 64, 8, 28672, 128256


class Block(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        head = DIM // HEADS
        self.wq = nn.Linear(DIM, HEADS * head, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * head, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * head, bias=False)
        self.wo = nn.Linear(HEADS * head, DIM, bias=False)
        self.w1 = nn.Linear(DIM, FFN, bias=False)
        self.w2 = nn.Linear(FFN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, FFN, bias=False)
        self.attention_norm = nn.Parameter(torch.ones(DIM))
        self.ffn_norm = nn.Parameter(torch.ones(DIM))
        self.std = 0.02 / (2 * (depth + 1)) ** 0.5

    def init_weights(self) -> None:
        for norm in (self.attention_norm, self.ffn_norm):
            nn.init.ones_(norm)
        for linear in (self.wq, self.wk, self.wv, self.w1):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        for linear in (self.wo, self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=self.std)


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block(i) for i in range(LAYERS))
        self.norm = nn.Parameter(torch.ones(DIM))
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def init_weights(self) -> None:
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers:
            layer.init_weights()
        nn.init.ones_(self.norm)
        cutoff = 3 * DIM**-0.5
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=DIM**-0.5, a=-cutoff, b=cutoff)


CHECKED = _stand_ins._hand_out_results
VARIANTS = {"with the check": CHECKED, "without (results plain)": lambda result: None}


def init_weights_seconds(variant) -> float:
    _stand_ins._hand_out_results = variant
    torch.manual_seed(0)
    model = torchdefer.deferred_init(Transformer)
    start = time.perf_counter()
    with torch.no_grad():
        model.init_weights()
    return time.perf_counter() - start


def main() -> None:
    calls = [0]

    def counting(result):
        calls[0] += 1
        CHECKED(result)

    init_weights_seconds(counting)
    print(f"calls on handed-out fakes that reach the check in one init_weights(): {calls[0]}")
    times = {name: [] for name in VARIANTS}
    for _ in range(5):
        for name, variant in VARIANTS.items():
            times[name].append(init_weights_seconds(variant))
    for name, seconds in times.items():
        seconds.sort()
        print(f"init_weights() {name}: min {seconds[0] * 1e3:.1f} ms, median {seconds[2] * 1e3:.1f} ms")

    p = torchdefer.deferred_init(nn.Linear, 64, 64).weight
    for name, variant in list(VARIANTS.items()) * 2:
        _stand_ins._hand_out_results = variant
        op = min(timeit.repeat(lambda: p * 2, number=2000, repeat=5)) / 2000
        shape = min(timeit.repeat(lambda: p.shape, number=20000, repeat=5)) / 20000
        print(f"{name}: p * 2 {op * 1e6:.1f} us/call, p.shape {shape * 1e6:.2f} us/call")
    _stand_ins._hand_out_results = CHECKED
    fake = p * 2

    def check_and_undo():
        CHECKED(fake)
        fake.__class__ = torch.Tensor

    def undo():
        fake.__class__ = torch.Tensor

    both = min(timeit.repeat(check_and_undo, number=200000, repeat=5)) / 200000
    alone = min(timeit.repeat(undo, number=200000, repeat=5)) / 200000
    print(f"the check of one fake result: {(both - alone) * 1e9:.0f} ns")


if __name__ == "__main__":
    main()
