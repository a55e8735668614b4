"""diffusers (Hugging Face's diffusion zoo): UNets, autoencoders and diffusion transformers
built from the small configs of the library's own unit tests, no weights."""

from diffusers import (AutoencoderKL, DiTTransformer2DModel, FluxTransformer2DModel,
                       SD3Transformer2DModel, UNet1DModel, UNet2DConditionModel, UNet2DModel,
                       VQModel)
from harness import library_tests

CASES = {
    "diffusers/unet2d": lambda: UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D")),
    "diffusers/unet2d-condition": lambda: UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(32, 64), norm_num_groups=8, cross_attention_dim=32,
        attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D")),
    "diffusers/unet1d": lambda: UNet1DModel(
        sample_size=32, in_channels=14, out_channels=14, block_out_channels=(32, 64),
        down_block_types=("DownResnetBlock1D", "DownResnetBlock1D"),
        up_block_types=("UpResnetBlock1D",), mid_block_type="MidResTemporalBlock1D",
        out_block_type="OutConv1DBlock", act_fn="mish", layers_per_block=1,
        use_timestep_embedding=True, extra_in_channels=0, time_embedding_type="positional",
        flip_sin_to_cos=False, freq_shift=1.0, norm_num_groups=8),
    "diffusers/autoencoder-kl": lambda: AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
        norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2),
    "diffusers/vq": lambda: VQModel(
        in_channels=3, out_channels=3, latent_channels=3, block_out_channels=(32, 64),
        norm_num_groups=8, num_vq_embeddings=64, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2),
    "diffusers/dit": lambda: DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
        num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10),
    "diffusers/sd3-transformer": lambda: SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16,
        pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16),
    "diffusers/flux-transformer": lambda: FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
        axes_dims_rope=(4, 4, 8)),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
