"""What the examples share: the process group torchrun asks for, and the initial weights a test
compares with the single-process model."""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=5, help="training steps")
    parser.add_argument("--seed", type=int, default=0, help="the seed every rank records with")
    parser.add_argument("--save-initial", metavar="PATH", help="rank 0 saves the full weights before training")
    return parser.parse_args()


def start() -> torch.device:
    """Joins the process group torchrun describes: NCCL on GPUs, Gloo on CPUs."""
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def finish() -> None:
    """Waits for every rank, leaves the process group and ends the process.

    The process ends without the interpreter's shutdown (``os._exit``). FSDP2 keeps the process
    group, and with it Gloo's worker threads, alive past ``destroy_process_group()``, and a
    collective launched during backward holds a Python object (the context backward keeps in
    thread-local state). A worker thread that drops the last reference to one after shutdown has
    begun cannot take the GIL, and the process aborts ("terminate called without an active
    exception"). A barrier alone makes that rarer, not impossible: the test runs the examples with
    a slow GIL hand-off, under which it still failed one run in twelve. A script of your own that
    ends this way skips ``atexit`` handlers too: flush or close loggers (TensorBoard, wandb) first.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def full_state(model: torch.nn.Module) -> dict:
    """Every parameter and buffer whole (an all-gather of each DTensor), on the CPU."""
    state = {}
    for name, value in list(model.named_parameters()) + list(model.named_buffers()):
        value = value.full_tensor() if isinstance(value, DTensor) else value
        state[name] = value.detach().cpu()
    return state


def train(model: torch.nn.Module, steps: int, device: torch.device, batch_seed: int, vocab: int) -> None:
    """A few AdamW steps of next-token prediction on random tokens (the same batch wherever
    ``batch_seed`` is the same)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(batch_seed)
    for step in range(steps):
        tokens = torch.randint(vocab, (4, 9), generator=generator).to(device)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
