"""lucidrains' model libraries: x-transformers (decoder, encoder, encoder-decoder stacks with
their many options), rotary-embedding-torch, vector-quantize-pytorch, perceiver-pytorch (Perceiver
with tied layers, Perceiver IO) and linear-attention-transformer (reversible layers, local
attention heads), reformer-pytorch (LSH attention, axial positions, product-key memory) and
performer-pytorch (FAVOR+ random features, reversible)."""

import torch
from harness import library_tests
from linear_attention_transformer import LinearAttentionTransformerLM
from perceiver_pytorch import Perceiver, PerceiverIO
from performer_pytorch import PerformerLM
from reformer_pytorch import ReformerLM
from rotary_embedding_torch import RotaryEmbedding
from vector_quantize_pytorch import FSQ, LFQ, ResidualVQ, VectorQuantize
from x_transformers import (ContinuousTransformerWrapper, Decoder, Encoder, TransformerWrapper,
                            XTransformer)


def _decoder(**attn):
    return lambda: TransformerWrapper(num_tokens=256, max_seq_len=64,
                                      attn_layers=Decoder(dim=64, depth=2, heads=4, **attn))


CASES = {
    "x-transformers/decoder-rotary": _decoder(rotary_pos_emb=True),
    "x-transformers/decoder-alibi-glu": _decoder(alibi_pos_bias=True, ff_glu=True,
                                                 attn_num_mem_kv=4),
    "x-transformers/decoder-gqa-rmsnorm": _decoder(attn_kv_heads=2, use_rmsnorm=True,
                                                   rotary_xpos=True),
    "x-transformers/encoder-relpos": lambda: TransformerWrapper(
        num_tokens=256, max_seq_len=64, num_memory_tokens=2,
        attn_layers=Encoder(dim=64, depth=2, heads=4, rel_pos_bias=True)),
    "x-transformers/continuous": lambda: ContinuousTransformerWrapper(
        dim_in=16, dim_out=16, max_seq_len=64,
        attn_layers=Encoder(dim=64, depth=2, heads=4, dynamic_pos_bias=True)),
    "x-transformers/enc-dec": lambda: XTransformer(
        dim=64, enc_num_tokens=256, enc_depth=2, enc_heads=4, enc_max_seq_len=64,
        dec_num_tokens=256, dec_depth=2, dec_heads=4, dec_max_seq_len=64, tie_token_emb=True),
    "rotary-embedding-torch/lang": lambda: RotaryEmbedding(dim=32),
    "rotary-embedding-torch/xpos-learned": lambda: RotaryEmbedding(dim=32, use_xpos=True,
                                                                   learned_freq=True),
    "rotary-embedding-torch/pixel": lambda: RotaryEmbedding(dim=16, freqs_for="pixel",
                                                            max_freq=64),
    "vector-quantize-pytorch/vq": lambda: VectorQuantize(dim=64, codebook_size=128,
                                                         codebook_dim=16),
    "vector-quantize-pytorch/residual-vq": lambda: ResidualVQ(dim=64, codebook_size=64,
                                                              num_quantizers=3),
    "vector-quantize-pytorch/fsq": lambda: FSQ(levels=[8, 5, 5, 5], dim=64),
    "vector-quantize-pytorch/lfq": lambda: LFQ(dim=16, codebook_size=2 ** 8),
    "perceiver-pytorch/perceiver-tied": lambda: Perceiver(
        input_channels=3, input_axis=2, num_freq_bands=6, max_freq=10.0, depth=2, num_latents=16,
        latent_dim=32, cross_heads=1, latent_heads=4, cross_dim_head=8, latent_dim_head=8,
        num_classes=10, weight_tie_layers=True),
    "perceiver-pytorch/perceiver-io": lambda: PerceiverIO(
        dim=32, queries_dim=16, logits_dim=10, depth=2, num_latents=16, latent_dim=32,
        cross_heads=1, latent_heads=4, cross_dim_head=8, latent_dim_head=8, decoder_ff=True),
    "linear-attention-transformer/reversible-local": lambda: LinearAttentionTransformerLM(
        num_tokens=256, dim=64, heads=4, depth=2, max_seq_len=128, causal=True, emb_dim=32,
        dim_head=16, blindspot_size=8, n_local_attn_heads=2, local_attn_window_size=16,
        reversible=True, ff_chunks=2),
    "reformer-pytorch/lsh-axial-pkm": lambda: ReformerLM(
        num_tokens=256, dim=64, depth=2, max_seq_len=128, heads=4, causal=True, bucket_size=16,
        n_hashes=2, ff_chunks=2, axial_position_emb=True, axial_position_shape=(8, 16),
        num_mem_kv=2, n_local_attn_heads=1, pkm_layers=(1,), pkm_num_keys=16),
    "performer-pytorch/favor-reversible": lambda: PerformerLM(
        num_tokens=256, max_seq_len=128, dim=64, depth=2, heads=4, causal=True, nb_features=16,
        reversible=True, ff_chunks=2, ff_glu=True, local_attn_heads=1, rotary_position_emb=True),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
