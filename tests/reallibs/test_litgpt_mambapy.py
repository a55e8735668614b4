"""Lightning AI's litgpt (a training and fine-tuning framework: GPT with its named configs
shrunk, LoRA and MoE variants) and mambapy (pure-PyTorch Mamba and Jamba state-space models)."""

from harness import library_tests
from litgpt import GPT, Config
from litgpt.lora import GPT as LoRAGPT
from litgpt.lora import Config as LoRAConfig
from mambapy.jamba import JambaLM, JambaLMConfig
from mambapy.mamba import Mamba, MambaConfig

SMALL = dict(n_layer=2, n_embd=64, n_head=4, block_size=64, vocab_size=256, padded_vocab_size=256)


def _litgpt(name, **overrides):
    return lambda: GPT(Config.from_name(name, **{**SMALL, **overrides}))


CASES = {
    "litgpt/pythia": _litgpt("pythia-14m"),
    "litgpt/llama-3.2": _litgpt("Llama-3.2-1B", n_query_groups=2, intermediate_size=128),
    "litgpt/gemma-2": _litgpt("gemma-2-2b", n_query_groups=2, intermediate_size=128,
                              head_size=16),
    "litgpt/mixtral-moe": _litgpt("Mixtral-8x7B-v0.1", n_query_groups=2, intermediate_size=128,
                                  moe_intermediate_size=64, n_expert=4, n_expert_per_token=2),
    "litgpt/lora": lambda: LoRAGPT(LoRAConfig.from_name(
        "Llama-3.2-1B", **SMALL, n_query_groups=2, intermediate_size=128, lora_r=4,
        lora_alpha=8, lora_query=True, lora_value=True, lora_mlp=True)),
    "mambapy/mamba": lambda: Mamba(MambaConfig(d_model=32, n_layers=2)),
    "mambapy/mamba-mup-constant-dt": lambda: Mamba(MambaConfig(
        d_model=32, n_layers=2, dt_init="constant", mup=True, inner_layernorms=True)),
    "mambapy/jamba": lambda: JambaLM(JambaLMConfig(
        d_model=32, n_layers=4, mlp_size=64, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, vocab_size=256, attn_layer_offset=1, attn_layer_period=2)),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
