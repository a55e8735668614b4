"""Kornia's models, built from configs without weights: Segment Anything with a small ViT
encoder (relative position tables, a random Fourier positional matrix as a buffer, the prompt
encoder and two-way mask decoder), TinyViT (windowed attention with attention-bias tables and
index buffers computed from the window geometry), RT-DETR (ResNet-D backbone, hybrid encoder,
deformable decoder with grid-initialized sampling offsets) and the local feature descriptors
HyNet (filter response norms, thresholded linear units) and MKD (von Mises kernel embeddings
whose buffers are computed from the patch geometry)."""

import torch
from harness import library_tests
from kornia.feature import HyNet, MKDDescriptor
from kornia.models.rt_detr.model import RTDETR, RTDETRConfig
from kornia.models.sam.model import Sam, SamConfig
from kornia.models.tiny_vit import TinyViT

CASES = {
    "kornia/sam-small-encoder": lambda: Sam.from_config(SamConfig(
        encoder_embed_dim=32, encoder_depth=2, encoder_num_heads=2,
        encoder_global_attn_indexes=(1,))),
    "kornia/tiny-vit": lambda: TinyViT(
        img_size=64, num_classes=10, embed_dims=(16, 32, 32, 64), depths=(1, 1, 2, 1),
        num_heads=(1, 2, 2, 4), window_sizes=(4, 4, 4, 2)),
    "kornia/rt-detr-r18": lambda: RTDETR.from_config(RTDETRConfig(
        "resnet18d", num_classes=5, head_hidden_dim=64, head_num_queries=20,
        head_num_decoder_layers=2, neck_hidden_dim=64, neck_dim_feedforward=128)),
    "kornia/hynet-mkd": lambda: torch.nn.ModuleList([
        HyNet(pretrained=False), MKDDescriptor(patch_size=32, whitening=None)]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
