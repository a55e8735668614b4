"""Trainer flows: each model built as its library's trainer builds it, on the meta device, then
`to_empty(device="cpu")`, then the library's own init, all inside one `deferred_init(flow, seed)`.
Besides torch mode and shards (the suite's two checks), every tensor must be fake right after
deferred_init, and counter mode must keep each init call's promise and follow the seeds
(harness.py's module docstring).

- torchtitan 0.3.0, `Trainer.__init__`: `with torch.device("meta"), set_default_dtype(...)`:
  `config.build()`; `model.to_empty(device=init_device)`; `with torch.no_grad():
  model.init_weights(buffer_device=None)` (truncated normals from the default generator).
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


def _torchtitan(**layout):
    def flow(seed):
        from test_torchtitan import llama3_config
        from torchtitan.tools.utils import set_default_dtype

        with torch.device("meta"), set_default_dtype(torch.float32):
            model = llama3_config(**layout).build()
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
    "litgpt/trainer-flow-llama-3.2-meta": _litgpt(
        "Llama-3.2-1B", n_query_groups=2, intermediate_size=128),
    "litgpt/trainer-flow-pythia-fabric-empty-init": _litgpt("pythia-14m",
                                                            fabric_empty_init=True),
    "ai2-olmo-core/trainer-flow-olmo2": _olmo_core("olmo2_1M"),
    "ai2-olmo-core/trainer-flow-olmo2-llama-depth-init": _olmo_core(
        "olmo2_1M", init_method="llama_depth"),
    "ai2-olmo-core/trainer-flow-moe": _olmo_core("smallmoe", d_model=32, n_layers=2, n_heads=4),
}


(test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model,
 test_every_tensor_is_fake_after_deferred_init, test_counter_mode_keeps_the_init_promise) = (
    library_tests(FLOWS, trainer_flow=True))
