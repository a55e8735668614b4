"""The benchmark's models: the Llama 3 family shapes of bench/models/llama.h, as a torch.nn module
initialized the way torchtitan initializes it, and as a Hugging Face transformers config.

The shapes are the C++ table's (LlamaConfig::named); tests/python/test_bench_harness.py checks
that both sides count the same parameters.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    name: str
    dim: int = 8192
    n_layers: int = 80
    n_heads: int = 64
    n_kv_heads: int = 8
    ffn_dim: int = 28672
    vocab_size: int = 128256
    max_seq_len: int = 8192
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


CONFIGS: Dict[str, LlamaConfig] = {
    c.name: c
    for c in [
        LlamaConfig("llama3-405b", dim=16384, n_layers=126, n_heads=128, n_kv_heads=8, ffn_dim=53248),
        LlamaConfig("llama3-70b"),
        LlamaConfig("llama3-8b", dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336),
        LlamaConfig("llama3.2-1b", dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192),
        LlamaConfig("llama-125m", dim=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_dim=2048,
                    vocab_size=32000, max_seq_len=2048),
        LlamaConfig("llama-30m", dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024,
                    vocab_size=32000, max_seq_len=1024),
        LlamaConfig("tiny", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256,
                    max_seq_len=32),
    ]
}


def config(name: str) -> LlamaConfig:
    if name not in CONFIGS:
        raise ValueError(f"unknown Llama size '{name}'; known: {', '.join(CONFIGS)}")
    return CONFIGS[name]


def parameter_shapes(c: LlamaConfig) -> List[Tuple[int, ...]]:
    """Every parameter's shape, without building anything (the harness's memory estimates)."""
    layer = [
        (c.dim,),  # attention_norm
        (c.n_heads * c.head_dim, c.dim),
        (c.n_kv_heads * c.head_dim, c.dim),
        (c.n_kv_heads * c.head_dim, c.dim),
        (c.dim, c.n_heads * c.head_dim),
        (c.dim,),  # ffn_norm
        (c.ffn_dim, c.dim),
        (c.dim, c.ffn_dim),
        (c.ffn_dim, c.dim),
    ]
    return [(c.vocab_size, c.dim)] + layer * c.n_layers + [(c.dim,), (c.vocab_size, c.dim)]


def parameter_count(c: LlamaConfig) -> int:
    return sum(math.prod(shape) for shape in parameter_shapes(c))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)


class Block(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)
        self.feed_forward = FeedForward(c.dim, c.ffn_dim)


class Llama(nn.Module):
    """The C++ model's structure and initialization, in torchtitan's style: the constructor ends
    with init_weights(), which a meta-device user calls again after to_empty(). Only
    construction is benchmarked, so there is no forward()."""

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.config = c
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        self.register_buffer("rope_cos", torch.empty(c.max_seq_len, c.head_dim // 2))
        self.register_buffer("rope_sin", torch.empty(c.max_seq_len, c.head_dim // 2))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, generator: Optional[torch.Generator] = None) -> None:
        c = self.config
        inv_freq = 1.0 / torch.pow(c.rope_theta, torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        angles = torch.outer(torch.arange(c.max_seq_len, dtype=torch.float64), inv_freq).float()
        self.rope_cos.copy_(angles.cos())
        self.rope_sin.copy_(angles.sin())
        nn.init.normal_(self.tok_embeddings.weight, generator=generator)
        depth_std = 0.02 / math.sqrt(2.0 * c.n_layers)
        for block in self.layers:
            block.attention_norm.reset_parameters()
            block.ffn_norm.reset_parameters()
            for linear in (block.attention.wq, block.attention.wk, block.attention.wv, block.feed_forward.w1):
                nn.init.trunc_normal_(linear.weight, std=0.02, a=-0.04, b=0.04, generator=generator)
            for linear in (block.attention.wo, block.feed_forward.w2, block.feed_forward.w3):
                nn.init.trunc_normal_(linear.weight, std=depth_std, a=-2 * depth_std, b=2 * depth_std,
                                      generator=generator)
        self.norm.reset_parameters()
        final_std = c.dim**-0.5
        nn.init.trunc_normal_(self.output.weight, std=final_std, a=-3 * final_std, b=3 * final_std,
                              generator=generator)


def hf_config(c: LlamaConfig):
    """The same shape as a transformers LlamaConfig (untied embeddings, as the C++ model has)."""
    import transformers

    return transformers.LlamaConfig(
        hidden_size=c.dim,
        intermediate_size=c.ffn_dim,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        vocab_size=c.vocab_size,
        max_position_embeddings=c.max_seq_len,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.norm_eps,
        tie_word_embeddings=False,
    )
