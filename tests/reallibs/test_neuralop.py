"""NeuralOperator (`neuralop`) Fourier neural operators: FNO with dense complex spectral weights
(tensorly-torch's factorized tensors in their dense form, drawn complex), Tucker-factorized and
CP-factorized TFNO (a core and factors drawn per rank), a 1-D FNO with a linear skip and
channel-MLP, and U-shaped UNO (per-layer modes and scalings)."""

import torch
from harness import library_tests
from neuralop.models import FNO, TFNO, UNO

CASES = {
    "neuraloperator/fno-2d-dense": lambda: FNO(
        n_modes=(6, 6), in_channels=3, out_channels=1, hidden_channels=8, n_layers=2),
    "neuraloperator/tfno-tucker-cp": lambda: torch.nn.ModuleList([
        TFNO(n_modes=(6, 6), in_channels=2, out_channels=1, hidden_channels=8, n_layers=2,
             factorization="tucker", rank=0.5),
        TFNO(n_modes=(4, 4), in_channels=2, out_channels=1, hidden_channels=8, n_layers=1,
             factorization="cp", rank=0.5, norm="group_norm")]),
    "neuraloperator/fno-1d-complex-data": lambda: FNO(
        n_modes=(8,), in_channels=2, out_channels=2, hidden_channels=8, n_layers=2,
        complex_data=True, positional_embedding=None, fno_skip="linear"),
    "neuraloperator/uno": lambda: UNO(
        in_channels=3, out_channels=1, hidden_channels=8, lifting_channels=16,
        projection_channels=16, n_layers=3, uno_out_channels=[8, 16, 8],
        uno_n_modes=[[4, 4], [2, 2], [4, 4]], uno_scalings=[[1.0, 1.0], [0.5, 0.5], [2, 2]],
        channel_mlp_skip="linear"),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
