"""torch's own layers with every construction option that changes how they initialize:
nn.Transformer (encoder, decoder, norm-first, no bias), MultiheadAttention (separate key and
value sizes, bias_k/v, bfloat16), the recurrent layers (projections, bidirectional, cells) and
the convolution, normalization and embedding layers; the parametrizations (weight norm,
spectral norm with its power iterations, orthogonal maps), the old-style weight and spectral
norm hooks, and pruning masks; lazy layers shaped by a forward; quantization-aware training
prepared and run once (fused conv + batch norm, fake-quantize observers) and an EMA copy
(AveragedModel deep-copies the model) updated once, both while building."""

import torch
from harness import library_tests
import torch.ao.quantization as quantization
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.nn.utils import parametrizations, prune

def _lazy_with_forward():
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.LazyBatchNorm2d(), nn.Flatten(),
                          nn.LazyLinear(6), nn.Unflatten(1, (2, 3)),
                          nn.LazyInstanceNorm1d(track_running_stats=True))
    model(torch.randn(2, 3, 8, 8))  # train mode: the running statistics move
    return model


class _Quantizable(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant, self.dequant = quantization.QuantStub(), quantization.DeQuantStub()
        self.conv, self.bn, self.relu = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        x = self.relu(self.bn(self.conv(self.quant(x))))
        return self.dequant(self.fc(x.flatten(1)))


def _qat_prepared_and_run():
    model = _Quantizable().train()
    model.qconfig = quantization.get_default_qat_qconfig("fbgemm")
    model = quantization.prepare_qat(quantization.fuse_modules_qat(model, [["conv", "bn", "relu"]]))
    model(torch.randn(2, 3, 8, 8))  # observers and the fused batch norm update their buffers
    return model


def _ema_updated():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    model(torch.randn(5, 4))
    average.update_parameters(model)
    return nn.ModuleList([model, average])


def _pruned():
    linear = nn.Linear(8, 8)
    prune.l1_unstructured(linear, "weight", amount=0.3)
    prune.random_unstructured(linear, "bias", amount=0.5)
    return linear


CASES = {
    "torch/transformer": lambda: nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2,
                                                num_decoder_layers=2, dim_feedforward=64),
    "torch/encoder-norm-first-no-bias": lambda: nn.TransformerEncoder(
        nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=True, bias=False), 2,
        enable_nested_tensor=False),
    "torch/mha-kdim-vdim-bias-kv": lambda: nn.MultiheadAttention(
        32, 4, kdim=16, vdim=24, add_bias_kv=True, add_zero_attn=True),
    "torch/mha-bf16": lambda: nn.MultiheadAttention(32, 4, dtype=torch.bfloat16),
    "torch/lstm-proj-bidirectional": lambda: nn.LSTM(16, 32, num_layers=2, bidirectional=True,
                                                     proj_size=8, batch_first=True),
    "torch/gru-bidirectional": lambda: nn.GRU(16, 32, num_layers=3, bidirectional=True,
                                              dropout=0.1),
    "torch/rnn-relu-no-bias": lambda: nn.RNN(16, 32, num_layers=2, nonlinearity="relu",
                                             bias=False),
    "torch/cells": lambda: nn.ModuleList([nn.LSTMCell(8, 16), nn.GRUCell(8, 16),
                                          nn.RNNCell(8, 16, nonlinearity="relu")]),
    "torch/conv-norm-embedding": lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ConvTranspose2d(8, 4, 3, groups=2),
        nn.GroupNorm(2, 4), nn.Conv1d(4, 4, 3, padding_mode="circular", padding=1),
        nn.InstanceNorm1d(4, affine=True), nn.PReLU(4), nn.Bilinear(4, 5, 6),
        nn.EmbeddingBag(10, 4), nn.Embedding(10, 4, padding_idx=2)),
    "torch/weight-norm": lambda: nn.Sequential(
        parametrizations.weight_norm(nn.Conv1d(4, 8, 3)),
        parametrizations.weight_norm(nn.ConvTranspose1d(8, 4, 4, stride=2), dim=1),
        nn.utils.weight_norm(nn.Conv1d(4, 8, 3))),
    "torch/spectral-norm": lambda: nn.ModuleList([
        parametrizations.spectral_norm(nn.Linear(8, 6), n_power_iterations=3),
        nn.utils.spectral_norm(nn.Linear(8, 6), n_power_iterations=2)]),
    "torch/orthogonal": lambda: nn.ModuleList([
        parametrizations.orthogonal(nn.Linear(6, 6)),
        parametrizations.orthogonal(nn.Linear(4, 6), orthogonal_map="cayley"),
        parametrizations.orthogonal(nn.Linear(6, 4), orthogonal_map="householder")]),
    "torch/prune": _pruned,
    "torch/lazy-with-forward": _lazy_with_forward,
    "torch/qat-prepared-and-run": _qat_prepared_and_run,
    "torch/ema-averaged-model": _ema_updated,
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
