"""MONAI, the medical-imaging framework: its segmentation and generative networks in 2-D and 3-D
(residual U-Net, Swin UNETR, UNETR, DynUNet with deep supervision, DenseNet, SegResNet, the
latent-diffusion autoencoder and diffusion U-Net), with their trunc_normal_ and kaiming inits."""

import torch
from harness import library_tests
from monai.networks import nets

CASES = {
    "monai/unet": lambda: nets.UNet(spatial_dims=2, in_channels=1, out_channels=2,
                                    channels=(8, 16, 32), strides=(2, 2), num_res_units=2,
                                    norm="batch"),
    "monai/swin-unetr": lambda: nets.SwinUNETR(in_channels=1, out_channels=2, feature_size=12,
                                               depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1),
                                               spatial_dims=2),
    "monai/unetr": lambda: nets.UNETR(in_channels=1, out_channels=2, img_size=(32, 32),
                                      feature_size=8, hidden_size=48, mlp_dim=96, num_heads=4,
                                      spatial_dims=2),
    "monai/dynunet-3d": lambda: nets.DynUNet(spatial_dims=3, in_channels=1, out_channels=2,
                                             kernel_size=[3, 3, 3], strides=[1, 2, 2],
                                             upsample_kernel_size=[2, 2], deep_supervision=True,
                                             deep_supr_num=1, res_block=True),
    "monai/densenet-segresnet": lambda: torch.nn.ModuleList([
        nets.DenseNet(spatial_dims=2, in_channels=1, out_channels=3, init_features=8,
                      growth_rate=8, block_config=(2, 2)),
        nets.SegResNet(spatial_dims=2, init_filters=8, in_channels=1, out_channels=2,
                       blocks_down=(1, 1), blocks_up=(1,))]),
    "monai/autoencoder-kl": lambda: nets.AutoencoderKL(
        spatial_dims=2, in_channels=1, out_channels=1, channels=(8, 16), latent_channels=4,
        num_res_blocks=1, norm_num_groups=4, attention_levels=(False, True)),
    "monai/diffusion-unet": lambda: nets.DiffusionModelUNet(
        spatial_dims=2, in_channels=1, out_channels=1, channels=(8, 16),
        attention_levels=(False, True), num_res_blocks=1, num_head_channels=8, norm_num_groups=4),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
