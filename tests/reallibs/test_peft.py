"""PEFT (Hugging Face's fine-tuning adapters) on a small transformers Llama (float32, and
bfloat16 as fine-tuning recipes load it): the adapters' own initialization code (LoRA and its
variants, DoRA's weight norms, OLoRA's QR, LoHa, LoKr, IA3, VeRA's shared projections, OFT),
each built with its base model under deferred_init."""

import torch
import transformers
from harness import library_tests
from peft import (IA3Config, LoHaConfig, LoKrConfig, LoraConfig, OFTConfig, VeraConfig,
                  get_peft_model)

transformers.logging.set_verbosity_error()
TARGETS = ["q_proj", "v_proj"]


def _adapter(config, **from_config):
    def build():
        base = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64), **from_config)
        return get_peft_model(base, config())
    return build


CASES = {
    "peft/lora": _adapter(lambda: LoraConfig(r=4, target_modules=TARGETS)),
    # A fine-tuning recipe's base model in bfloat16 (from_config sets the default dtype).
    "peft/lora-bf16-base": _adapter(lambda: LoraConfig(r=4, target_modules=TARGETS),
                                    dtype=torch.bfloat16),
    "peft/lora-gaussian-rslora": _adapter(lambda: LoraConfig(
        r=4, target_modules=TARGETS, init_lora_weights="gaussian", use_rslora=True)),
    "peft/dora": _adapter(lambda: LoraConfig(r=4, target_modules=TARGETS, use_dora=True)),
    "peft/olora": _adapter(lambda: LoraConfig(r=4, target_modules=TARGETS,
                                              init_lora_weights="olora")),
    "peft/loha": _adapter(lambda: LoHaConfig(r=4, target_modules=TARGETS)),
    "peft/lokr": _adapter(lambda: LoKrConfig(r=4, target_modules=TARGETS)),
    "peft/ia3": _adapter(lambda: IA3Config(target_modules=["k_proj", "down_proj"],
                                           feedforward_modules=["down_proj"])),
    "peft/vera": _adapter(lambda: VeraConfig(r=4, target_modules=TARGETS)),
    "peft/oft": _adapter(lambda: OFTConfig(r=0, oft_block_size=8, target_modules=TARGETS)),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
