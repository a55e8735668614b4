"""flash-linear-attention (fla): its Hugging Face-style causal LMs of linear-attention and
state-space layers (GLA, DeltaNet, Gated DeltaNet, RetNet, HGRN2, Mamba2, RWKV6, RWKV7 with its
orthogonal and layer-dependent inits), built on the CPU from
small configs (their Triton kernels run only in the forward, never at construction)."""

import warnings

import fla.models as fla_models
from harness import library_tests

warnings.filterwarnings("ignore", message=".*CPU.*")  # fla warns that it runs best on a GPU

_SMALL = dict(hidden_size=64, num_hidden_layers=2, vocab_size=256, intermediate_size=128,
              fuse_cross_entropy=False)


def _lm(name, **config):
    config_class = getattr(fla_models, f"{name}Config")
    model_class = getattr(fla_models, f"{name}ForCausalLM")
    return lambda: model_class(config_class(**_SMALL, **config))


CASES = {
    "fla/gla": _lm("GLA", num_heads=2),
    "fla/deltanet": _lm("DeltaNet", num_heads=2),
    "fla/gated-deltanet": _lm("GatedDeltaNet", num_heads=2, head_dim=32),
    "fla/retnet": _lm("RetNet", num_heads=2),
    "fla/hgrn2": _lm("HGRN2", num_heads=2, expand_ratio=32),
    "fla/mamba2": _lm("Mamba2", num_heads=4, head_dim=32, state_size=16, n_groups=1),
    "fla/rwkv6": _lm("RWKV6", num_heads=2),
    "fla/rwkv7": _lm("RWKV7", head_dim=32),
}


# RWKV7's orthogonal inits (a QR each) are computed whole on every rank, region replay's fallback
# for them, so each rank costs about the full model (4 s of CPU at W = 7): over two world sizes
# its check stays near 10 s instead of 40.
_WORLD_SIZES = {"fla/rwkv7": (2, 3)}

test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES, _WORLD_SIZES))
