"""mup (Maximal Update Parametrization): set_base_shapes compares the model's parameter shapes
with a base and a delta model (built in the same construction), attaches an infshape to every
parameter and rescales the readout; mup.init then reinitializes each parameter from its
infshape's width multiplier. A readout shared with the embedding (MuSharedReadout) is a tied
weight."""

import mup
import torch
from harness import library_tests
from mup.layer import MuSharedReadout


class _Mlp(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, width), torch.nn.Linear(width, width)
        self.readout = mup.MuReadout(width, 4)


def _mlp():
    model = _Mlp(32)
    mup.set_base_shapes(model, _Mlp(4), delta=_Mlp(8))
    for p in model.parameters():
        if p.dim() >= 2:
            mup.init.kaiming_uniform_(p, a=5 ** 0.5)
    return model


class _Lm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.embedding = torch.nn.Embedding(16, d)
        self.block = torch.nn.TransformerEncoderLayer(d, 2, 2 * d, batch_first=True)
        self.readout = MuSharedReadout(self.embedding.weight)


def _lm():
    model = _Lm(32)
    mup.set_base_shapes(model, _Lm(8), delta=_Lm(16))
    for p in model.parameters():
        if p.dim() >= 2:
            mup.init.normal_(p, std=0.02)
    return model


CASES = {"mup/mlp-readout": _mlp, "mup/shared-readout-transformer": _lm}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
