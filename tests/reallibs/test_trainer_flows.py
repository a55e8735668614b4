"""Trainer flows: each model built as its library's trainer builds it, on the meta device, then
`to_empty(device="cpu")`, then the library's own init, all inside one `deferred_init(flow, seed)`.
Besides torch mode and shards (the suite's two checks), every tensor must be fake right after
deferred_init, and counter mode must keep each init call's promise and follow the seeds
(harness.py's module docstring).

- torchtitan 0.3.0, `Trainer.__init__`: `with torch.device("meta"), set_default_dtype(...)`:
  `config.build()`; `model.to_empty(device=init_device)`; `with torch.no_grad():
  model.init_weights(buffer_device=None)` (truncated normals from the default generator): Llama 3,
  Qwen3-MoE and DeepSeek-V3 with multi-token prediction.
- litgpt 0.5.13, `pretrain.py`: `fabric.init_module(empty_init=True)` (the meta device under its
  FSDP strategy, `_EmptyInit` on one device), then `initialize_weights(fabric, model, ...)`, which
  points every Linear's and Embedding's `reset_parameters` at GPT-NeoX's normal init and calls
  them all (FSDP calls them after `to_empty` when it materializes the meta model).
- ai2-olmo-core 3.0.0, `parallelize_model`: `TransformerConfig.build(init_device="meta")`, then
  `model.init_weights(max_seq_len=..., device=...)`, which calls `to_empty` itself, then every
  `reset_parameters()`, then draws every weight from
  `torch.Generator(device).manual_seed(config.init_seed)` and returns that generator."""

from types import SimpleNamespace

import torch
from harness import library_tests


def _qwen3_moe_config():
    """Qwen3-MoE as torchtitan's debugmodel_moe lays it out, made smaller."""
    from torchtitan.models import qwen3
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear

    return qwen3.Qwen3Model.Config(
        vocab_size=256, dim=64, norm=qwen3._qwen3_norm(64),
        tok_embeddings=Embedding.Config(num_embeddings=256, embedding_dim=64,
                                        param_init=qwen3._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=64, out_features=256, param_init=qwen3._LINEAR_INIT),
        layers=qwen3._build_qwen3_moe_layers(
            n_layers=2, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, moe_hidden_dim=32,
            num_experts=4, top_k=2, attn_backend="flex", moe_comm_backend="standard",
            rope=CosSinRoPE.Config(dim=16, max_seq_len=64, theta=1e6)))


def _deepseek_v3_config():
    """DeepSeek-V3 as torchtitan's debugmodel lays it out (latent attention, a dense layer, MoE
    with a shared expert, YaRN RoPE, a multi-token-prediction layer), made smaller."""
    from torchtitan.models import deepseek_v3 as ds
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    layers = ds._build_dsv3_layers(
        n_layers=2, n_dense_layers=1, dim=64, n_heads=4, q_lora_rank=0, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, mscale=0.7, dense_hidden_dim=128,
        moe_hidden_dim=32, num_experts=4, num_shared_experts=1, router_top_k=2,
        router_score_func="softmax", attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=8, max_seq_len=64, theta=1e4, scaling="yarn", rope_factor=40.0,
                                beta_fast=32.0, beta_slow=1.0, original_seq_len=16))
    return ds.DeepSeekV3Model.Config(
        vocab_size=256, dim=64,
        tok_embeddings=Embedding.Config(num_embeddings=256, embedding_dim=64,
                                        param_init=ds._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=64, param_init=ds._NORM_INIT),
        lm_head=Linear.Config(in_features=64, out_features=256,
                              param_init=ds._output_linear_init(64)),
        layers=layers, mtp_layers=ds._build_mtp_layers(layers[-1], dim=64, num_mtp_layers=1))


def _torchtitan(make_config=None, **layout):
    def flow(seed):
        from test_torchtitan import llama3_config
        from torchtitan.tools.utils import set_default_dtype

        with torch.device("meta"), set_default_dtype(torch.float32):
            model = (make_config() if make_config else llama3_config(**layout)).build()
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        return model, {}
    return flow


def _litgpt(name, *, fabric_empty_init=False, **overrides):
    small = dict(n_layer=2, n_embd=64, n_head=4, block_size=64, vocab_size=256,
                 padded_vocab_size=256)

    def flow(seed):
        import lightning as L
        from litgpt import GPT, Config
        from litgpt.pretrain import initialize_weights

        config = Config.from_name(name, **{**small, **overrides})
        if fabric_empty_init:  # pretrain.py on one device: Fabric's _EmptyInit, no meta
            fabric = L.Fabric(accelerator="cpu", devices=1)
            with fabric.init_module(empty_init=True):
                model = GPT(config)
        else:  # under FSDPStrategy, init_module(empty_init=True) is the meta device
            with torch.device("meta"):
                model = GPT(config)
            model.to_empty(device="cpu")
            # FSDP calls each module's reset_parameters after its to_empty; initialize_weights
            # calls them all itself for a strategy that is not FSDP's.
            fabric = SimpleNamespace(strategy=None)
        initialize_weights(fabric, model, n_layer=config.n_layer, n_embd=config.n_embd)
        return model, {}
    return flow


def _olmo_core(preset, *, init_method=None, **overrides):
    def flow(seed):
        from olmo_core.nn.transformer import InitMethod, TransformerConfig

        config = getattr(TransformerConfig, preset)(vocab_size=256, **overrides)
        config.init_seed = seed  # smallmoe() drops an init_seed given to it
        if init_method is not None:
            config.init_method = getattr(InitMethod, init_method)
        model = config.build(init_device="meta")
        generator = model.init_weights(max_seq_len=64, device=torch.device("cpu"))
        return model, {"init_weights": generator}
    return flow


FLOWS = {
    "torchtitan/trainer-flow-llama3": _torchtitan(),
    "torchtitan/trainer-flow-llama3-gqa-tied": _torchtitan(n_kv_heads=2, fuse_qkv=False,
                                                           tied=True),
    "torchtitan/trainer-flow-qwen3-moe": _torchtitan(_qwen3_moe_config),
    "torchtitan/trainer-flow-deepseek-v3-mtp": _torchtitan(_deepseek_v3_config),
    "litgpt/trainer-flow-llama-3.2-meta": _litgpt(
        "Llama-3.2-1B", n_query_groups=2, intermediate_size=128),
    "litgpt/trainer-flow-pythia-fabric-empty-init": _litgpt("pythia-14m",
                                                            fabric_empty_init=True),
    "ai2-olmo-core/trainer-flow-olmo2": _olmo_core("olmo2_1M"),
    "ai2-olmo-core/trainer-flow-olmo2-llama-depth-init": _olmo_core(
        "olmo2_1M", init_method="llama_depth"),
    "ai2-olmo-core/trainer-flow-moe": _olmo_core("smallmoe", d_model=32, n_layers=2, n_heads=4),
    # nGPT: init_weights normalizes every matrix after drawing it (values read and rewritten).
    "ai2-olmo-core/trainer-flow-ngpt": _olmo_core("ngpt_like", d_model=32, n_layers=2, n_heads=4),
}


(test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model,
 test_every_tensor_is_fake_after_deferred_init, test_counter_mode_keeps_the_init_promise) = (
    library_tests(FLOWS, trainer_flow=True))
