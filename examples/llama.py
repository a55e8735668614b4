"""A small Llama (RMSNorm, rotary embeddings, SwiGLU) and its parallel layouts, as torchtitan
lays them out: the model the examples train and tests/python/test_dtensor.py checks.

Sizes are chosen not to divide by 2 or 4 where Llama allows it (vocabulary, feed-forward width),
so shards are uneven.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab: int = 101
    dim: int = 48
    layers: int = 2
    heads: int = 4
    hidden: int = 100
    max_seq: int = 16


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.head_dim = cfg.dim // cfg.heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds its own heads.
        q, k, v = (w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, cos[:seq], sin[:seq]), rotate(k, cos[:seq], sin[:seq])
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: Config = Config()):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        half = cfg.dim // cfg.heads // 2
        self.register_buffer("rope_cos", torch.empty(cfg.max_seq, half), persistent=False)
        self.register_buffer("rope_sin", torch.empty(cfg.max_seq, half), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The rotary embedding's tables (non-persistent: in no state dict)."""
        seq, half = self.rope_cos.shape
        device = self.rope_cos.device
        angles = torch.outer(
            torch.arange(seq, dtype=torch.float32, device=device),
            10000.0 ** (-torch.arange(half, device=device) / half),
        )
        self.rope_cos.copy_(angles.cos())
        self.rope_sin.copy_(angles.sin())

    @torch.no_grad()
    def init_weights(self) -> None:
        """torchtitan's initialization. Called by __init__, so deferred init keeps it; a model
        built on the meta device calls it again after to_empty() (what torchdefer replaces)."""
        self.init_buffers()
        nn.init.normal_(self.tok_embeddings.weight)
        for index, block in enumerate(self.layers):
            depth_std = 0.02 / math.sqrt(2 * (index + 1))
            for linear in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1):
                nn.init.trunc_normal_(linear.weight, std=0.02)
            for linear in (block.attention.wo, block.feed_forward.w2, block.feed_forward.w3):
                nn.init.trunc_normal_(linear.weight, std=depth_std)
            for norm in (block.attention_norm, block.ffn_norm):
                nn.init.ones_(norm.weight)
        nn.init.ones_(self.norm.weight)
        bound = self.output.in_features**-0.5
        nn.init.trunc_normal_(self.output.weight, std=bound, a=-3 * bound, b=3 * bound)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for block in self.layers:
            x = block(x, self.rope_cos, self.rope_sin)
        return self.output(self.norm(x))


def tensor_parallel(model: Llama, mesh) -> None:
    """torchtitan's plan: attention and feed-forward split by heads and hidden units, norms and
    the activations between blocks sharded along the sequence (SequenceParallel)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    for block in model.layers:
        parallelize_module(
            block,
            mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
                ),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            },
        )


def fully_shard_llama(model: Llama, mesh) -> None:
    """FSDP2 as torchtitan applies it: each block, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
