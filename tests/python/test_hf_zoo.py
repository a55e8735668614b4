"""Real model code: Hugging Face transformers models built from small configs (no weights are
downloaded), eager vs deferred_init + materialize_module, bit for bit; and their shards."""

import pytest
import torch
import torchdefer
import transformers  # installed by scripts/dev.sh; a missing one must fail, not skip

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=64,
)
TOKENS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, decoder_start_token_id=3)


def zoo():
    t = transformers
    causal, base = t.AutoModelForCausalLM, t.AutoModel
    return {
        "llama": (t.LlamaConfig(**SMALL), causal),
        "mistral": (t.MistralConfig(**SMALL), causal),
        "qwen2": (t.Qwen2Config(**SMALL), causal),
        "mixtral": (t.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2), causal),
        "gpt2-tied": (t.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64,
                                   bos_token_id=1, eos_token_id=2), causal),
        "bert": (t.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=128, vocab_size=256), base),
        "t5": (t.T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256, d_kv=16),
               base),
        "vit": (t.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=128, image_size=32, patch_size=8), base),
        "clip": (t.CLIPConfig(
            text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, vocab_size=256),
            vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, image_size=32, patch_size=8)), base),
        "whisper": (t.WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2,
                                    encoder_attention_heads=4, decoder_attention_heads=4,
                                    encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=256,
                                    num_mel_bins=16, max_source_positions=32,
                                    max_target_positions=32, **TOKENS), base),
    }


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


@pytest.mark.parametrize("name", list(zoo()))
def test_hf_model_materializes_to_eager_bitwise(name):
    config, auto = zoo()[name]
    torch.manual_seed(0)
    eager = auto.from_config(config)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(auto.from_config, config)
    assert torchdefer.is_deferred(deferred)
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)
    eager_state, deferred_state = eager.state_dict(), deferred.state_dict()
    assert eager_state.keys() == deferred_state.keys()
    for key, value in eager_state.items():
        assert bitwise_equal(value, deferred_state[key]), f"{name}: {key}"
    if name == "gpt2-tied":
        assert deferred.lm_head.weight is deferred.transformer.wte.weight


@pytest.mark.parametrize("name", ["llama", "gpt2-tied", "bert"])
def test_hf_model_shards_concatenate_to_the_full_counter_model(name):
    config, auto = zoo()[name]

    def record():
        torch.manual_seed(3)
        return torchdefer.deferred_init(auto.from_config, config)

    full = record()
    torchdefer.materialize_module(full, rng="counter")
    world = 3
    locals_ = [record() for _ in range(world)]
    for rank, local in enumerate(locals_):
        torchdefer.materialize_module(local, shard=torchdefer.Shard(rank, world))
    for key, value in full.named_parameters():
        parts = [dict(local.named_parameters())[key] for local in locals_]
        joined = torch.cat(parts) if value.dim() > 0 else parts[0]
        assert bitwise_equal(joined, value), f"{name}: {key}"
