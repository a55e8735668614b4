"""NX-AI's xLSTM (the block stack with mLSTM blocks and a vanilla-backend sLSTM block: small
and Wang inits, input- and forget-gate biases from linspace, causal convolutions; and the
xLSTM-7B architecture, `xLSTMLarge`, with native kernels) and torchkbnufft's non-uniform FFT
modules (Kaiser-Bessel interpolation tables, complex scaling coefficients and grid buffers that
are computed from the image geometry while building).

torchkbnufft compiles its FFT helpers with torch.jit.script when it is imported, and those call
torch.index_select, which PyTorch Geometric replaces by a Python function when it is imported:
this file's name sorts it before test_torch_geometric.py, so pytest imports torchkbnufft first."""

import torch
from harness import library_tests
from torchkbnufft import KbInterp, KbNufft, KbNufftAdjoint, ToepNufft
from xlstm import (FeedForwardConfig, mLSTMBlockConfig, mLSTMLayerConfig, sLSTMBlockConfig,
                   sLSTMLayerConfig, xLSTMBlockStack, xLSTMBlockStackConfig)
from xlstm.xlstm_large.model import xLSTMLarge, xLSTMLargeConfig


def _block_stack():
    return xLSTMBlockStack(xLSTMBlockStackConfig(
        mlstm_block=mLSTMBlockConfig(mlstm=mLSTMLayerConfig(
            conv1d_kernel_size=4, qkv_proj_blocksize=4, num_heads=4)),
        slstm_block=sLSTMBlockConfig(
            slstm=sLSTMLayerConfig(backend="vanilla", num_heads=4, conv1d_kernel_size=4,
                                   bias_init="powerlaw_blockdependent"),
            feedforward=FeedForwardConfig(proj_factor=1.3, act_fn="gelu")),
        context_length=32, num_blocks=3, embedding_dim=32, slstm_at=[1]))


def _large():
    model = xLSTMLarge(xLSTMLargeConfig(
        embedding_dim=64, num_heads=4, num_blocks=2, vocab_size=128,
        chunkwise_kernel="chunkwise--native_autograd", sequence_kernel="native_sequence__native",
        step_kernel="native"))
    return model


CASES = {
    "xlstm/block-stack-mlstm-slstm": _block_stack,
    "xlstm/xlstm-large": _large,
    "torchkbnufft/nufft-2d": lambda: torch.nn.ModuleList([
        KbNufft(im_size=(16, 16)), KbNufftAdjoint(im_size=(16, 16), grid_size=(24, 24)),
        KbInterp(im_size=(8, 8), grid_size=(16, 16), numpoints=4), ToepNufft()]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
