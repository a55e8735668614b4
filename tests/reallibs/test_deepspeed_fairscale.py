"""Distributed-training libraries' own layers, built without a process group: DeepSpeed's MoE
experts (one expert deep-copied per local expert) and its top-k gate, and FairScale's
FlattenParamsWrapper, which concatenates a module's parameters into one flat parameter and makes
the originals views of it."""

import torch
from deepspeed.moe.experts import Experts
from deepspeed.moe.sharded_moe import TopKGate
from fairscale.nn.misc import FlattenParamsWrapper
from harness import library_tests


def _experts_and_gate():
    expert = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    return torch.nn.ModuleList([Experts(expert, num_local_experts=3), TopKGate(8, 4, k=2)])


CASES = {
    "deepspeed/moe-experts-topk-gate": _experts_and_gate,
    "fairscale/flatten-params-wrapper": lambda: FlattenParamsWrapper(torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 3))),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
