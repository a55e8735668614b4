"""torchtitan (PyTorch's native training platform): Llama 3 built the way its trainer does
(config.build(), then init_weights(): per-parameter truncated normals with depth-scaled
stds, complex RoPE tables as buffers), at the debug model's layout made smaller."""

from harness import library_tests
from torchtitan.models import llama3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

DIM, HEADS, VOCAB = 64, 4, 256


def llama3_config(*, n_kv_heads=None, fuse_qkv=True, tied=False):
    """The debug model's layout made smaller (test_trainer_flows.py builds it too)."""
    return llama3.Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB, enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=VOCAB, embedding_dim=DIM,
            param_init=llama3._EMBEDDING_SKIP_INIT if tied else llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB,
                              param_init=llama3._output_linear_init(DIM)),
        layers=llama3._build_llama3_layers(
            n_layers=2, dim=DIM, n_heads=HEADS, n_kv_heads=n_kv_heads, hidden_dim=128,
            fuse_qkv=fuse_qkv, attn_backend="flex",
            rope=ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=64, theta=500000,
                                    scaling="llama")))


def _llama3(**layout):
    def build():
        model = llama3_config(**layout).build()
        model.init_weights(buffer_device=None)
        return model
    return build


CASES = {
    "torchtitan/llama3-fused-qkv": _llama3(),
    "torchtitan/llama3-gqa-separate-qkv": _llama3(n_kv_heads=2, fuse_qkv=False),
    "torchtitan/llama3-tied": _llama3(n_kv_heads=2, tied=True),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
