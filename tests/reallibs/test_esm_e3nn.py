"""Scientific model code: Meta's protein language models (fair-esm: ESM-2 with rotary
embeddings, ESM-1b, the MSA Transformer with row and column attention), built from the arguments
their training scripts parse, and e3nn's E(3)-equivariant layers (irreps linear maps, tensor
products with their path weights, gates, equivariant batch norm)."""

import argparse

import esm
import torch
from e3nn import nn as enn
from e3nn import o3
from esm.model.esm2 import ESM2
from harness import library_tests


def _parsed(model, **overrides):
    parser = argparse.ArgumentParser()
    model.add_args(parser)
    args = parser.parse_args([])
    vars(args).update(overrides)
    return args


def _esm1b():
    args = _parsed(esm.ProteinBertModel, arch="roberta_large", layers=2, embed_dim=32,
                   ffn_embed_dim=64, attention_heads=4, final_bias=True, max_positions=64,
                   emb_layer_norm_before=True, token_dropout=False)
    return esm.ProteinBertModel(args, esm.Alphabet.from_architecture("ESM-1b"))


def _msa_transformer():
    args = _parsed(esm.MSATransformer, layers=2, embed_dim=32, ffn_embed_dim=64,
                   attention_heads=4, max_positions=64, embed_positions_msa=True)
    args.max_tokens = args.max_tokens_per_msa
    return esm.MSATransformer(args, esm.Alphabet.from_architecture("msa_transformer"))


_IN, _OUT = o3.Irreps("8x0e + 4x1o"), o3.Irreps("4x0e + 2x1o + 2x2e")

CASES = {
    "fair-esm/esm2-token-dropout": lambda: ESM2(num_layers=2, embed_dim=32, attention_heads=4,
                                                alphabet="ESM-1b", token_dropout=True),
    "fair-esm/esm1b": _esm1b,
    "fair-esm/msa-transformer": _msa_transformer,
    "e3nn/linear-tensor-product": lambda: torch.nn.ModuleList([
        o3.Linear(_IN, _OUT), o3.FullyConnectedTensorProduct(_IN, o3.Irreps("1x0e + 1x1o"), _OUT),
        o3.SphericalHarmonics([0, 1, 2], normalize=True)]),
    "e3nn/gate-mlp-batchnorm": lambda: torch.nn.ModuleList([
        enn.Gate("4x0e", [torch.relu], "2x0e", [torch.sigmoid], "2x1o"),
        enn.FullyConnectedNet([4, 16, 8], torch.nn.functional.silu), enn.BatchNorm(_IN)]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
