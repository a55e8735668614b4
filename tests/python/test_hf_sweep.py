"""Every Hugging Face transformers (5.23) architecture that builds small on a CPU, through
AutoModel.from_config and AutoModelForCausalLM.from_config: eager vs deferred_init +
materialize_module, bit for bit (torch mode).

Small configs are derived, not written by hand: each architecture's default config with its
sizes (widths, depths, heads, vocabulary, experts) lowered, the lists that follow the layer
count cut to match and the token ids folded into the smaller vocabulary. Where the
architecture's config validation rejects that, fewer sizes are lowered, down to the default
config itself; the first candidate whose parameters and buffers fit in CAP (counted on the meta
device, so nothing large is ever allocated) is the one tested. An architecture for which none
fits is on NOT_TINY below with the reason and skipped with it (TORCHDEFER_HF_SWEEP=verify
checks those instead: each must still raise NotTiny). An architecture that builds but does not
materialize is on TORCHDEFER_LIMITS, a strict xfail: an entry that starts passing fails the test.

TORCHDEFER_HF_SWEEP=all runs the NOT_TINY architectures too, each at the smallest config it
builds (every candidate, and one that also lowers the per-stage width and depth lists of vision
and audio models), up to TORCHDEFER_HF_SWEEP_CAP_MIB (default 256) of parameters and buffers;
one that builds no config, or none under that cap, is skipped with the sizes it tried.
TORCHDEFER_HF_SWEEP=not-tiny runs only those. It takes minutes (docs/model-coverage.md has the
counts and the time).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Dict, List, Tuple

import pytest
import torch
import torchdefer
import transformers  # installed by scripts/dev.sh; a missing one must fail, not skip
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)

transformers.logging.set_verbosity_error()

CAP = 20 << 20  # bytes of parameters and buffers
VERIFY_EXCLUSIONS = os.environ.get("TORCHDEFER_HF_SWEEP") == "verify"
RUN_ALL = os.environ.get("TORCHDEFER_HF_SWEEP") in ("all", "not-tiny")
ONLY_NOT_TINY = os.environ.get("TORCHDEFER_HF_SWEEP") == "not-tiny"
ALL_CAP = int(os.environ.get("TORCHDEFER_HF_SWEEP_CAP_MIB", "256")) << 20

SMALL = {
    **dict.fromkeys(["hidden_size", "d_model", "n_embd", "n_embed", "embed_dim"], 64),
    **dict.fromkeys(["intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
                     "n_inner"], 128),
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    **dict.fromkeys(["num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
                     "decoder_layers", "num_encoder_layers", "num_decoder_layers"], 2),
    **dict.fromkeys(["num_attention_heads", "num_heads", "n_head", "n_heads",
                     "encoder_attention_heads", "decoder_attention_heads"], 4),
    "num_key_value_heads": 2,
    "head_dim": 16,
    "d_kv": 16,
    "vocab_size": 256,
    **dict.fromkeys(["max_position_embeddings", "n_positions"], 128),
    **dict.fromkeys(["num_local_experts", "num_experts", "n_routed_experts"], 4),
    "num_experts_per_tok": 2,
}
LAYER_COUNTS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers")
# Per-stage lists (vision backbones, audio codecs) that the deep candidate of
# TORCHDEFER_HF_SWEEP=all lowers element by element: widths to 64, depths to 1.
STAGE_WIDTHS = ("hidden_sizes", "embed_dims", "embed_dim", "dims", "channels", "hidden_dims",
                "num_channels", "encoder_hidden_sizes", "neck_hidden_sizes",
                "upsampling_rates", "downsampling_ratios", "upsampling_ratios")
STAGE_DEPTHS = ("depths", "num_layers", "layers", "num_blocks", "block_repeats")

# Candidates, in order: the sizes each one leaves at their defaults (None: the default config).
CANDIDATES = [
    (),
    ("num_key_value_heads",),
    ("num_key_value_heads", "vocab_size"),
    ("num_key_value_heads", "vocab_size", "head_dim", *LAYER_COUNTS),
    None,
]


class NotTiny(Exception):
    """No candidate config of this architecture builds within CAP."""


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def _lowered(config: Dict[str, Any], keep: Tuple[str, ...], deep: bool = False) -> Dict[str, Any]:
    """The keyword arguments that lower the sizes of one config dict (and its sub-configs);
    ``deep`` also lowers the per-stage lists."""
    out: Dict[str, Any] = {}
    for key, value in config.items():
        if key in SMALL and key not in keep and type(value) is int and value > SMALL[key]:
            out[key] = SMALL[key]
        elif deep and key in STAGE_WIDTHS and _int_list(value) and max(value) > 64:
            out[key] = [min(v, 64) for v in value]
        elif deep and key in STAGE_DEPTHS and _int_list(value) and max(value) > 1:
            out[key] = [min(v, 1) for v in value]
        elif isinstance(value, dict) and "model_type" in value:
            lowered = _lowered(value, keep, deep)
            if lowered:
                out[key] = {**value, **lowered}
    layers = next((k for k in LAYER_COUNTS if k in out and type(config[k]) is int), None)
    if layers is not None:
        # Per-layer lists (layer_types, block types) follow the layer count.
        for key, value in config.items():
            if isinstance(value, list) and len(value) == config[layers] and key not in out:
                out[key] = value[: out[layers]]
    vocab = out.get("vocab_size")
    if vocab is not None:
        for key, value in config.items():
            if (key.endswith("_token_id") or key.endswith("_token_index")) and type(value) is int:
                out.setdefault(key, value % vocab)
    return out


def _state_bytes(module: torch.nn.Module) -> int:
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def tiny_config(model_type: str, auto: Any) -> Any:
    """The first candidate config of ``model_type`` that ``auto`` builds within CAP."""
    config_class = CONFIG_MAPPING[model_type]
    attempts = []
    for keep in CANDIDATES:
        try:
            if keep is None:
                config = config_class()
            else:
                config = config_class(**_lowered(config_class().to_dict(), keep))
            with torch.device("meta"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                size = _state_bytes(auto.from_config(config))
        except Exception as e:  # an architecture's own validation: try the next candidate
            first_line = (str(e).strip().splitlines() or [""])[0]
            attempts.append(f"{type(e).__name__}: {first_line[:120]}")
            continue
        if size <= CAP:
            return config
        attempts.append(f"{size >> 20} MiB")
    raise NotTiny(f"{model_type}: " + " | ".join(attempts))


def smallest_config(model_type: str, auto: Any) -> Any:
    """The smallest config of ``model_type`` that ``auto`` builds (TORCHDEFER_HF_SWEEP=all):
    every candidate, deep-lowered and not, is built on the meta device and measured. Skips the
    architecture, with what was tried, when none builds or the smallest is over ALL_CAP."""
    config_class = CONFIG_MAPPING[model_type]
    attempts, built = [], []
    for keep, deep in [((), True)] + [(keep, False) for keep in CANDIDATES]:
        try:
            if keep is None:
                config = config_class()
            else:
                config = config_class(**_lowered(config_class().to_dict(), keep, deep))
            with torch.device("meta"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built.append((_state_bytes(auto.from_config(config)), len(built), config))
        except Exception as e:  # an architecture's own validation: try the next candidate
            first_line = (str(e).strip().splitlines() or [""])[0]
            attempts.append(f"{type(e).__name__}: {first_line[:120]}")
    if not built:
        pytest.skip(f"not buildable: {model_type}: " + " | ".join(sorted(set(attempts))))
    size, _, config = min(built, key=lambda entry: entry[:2])
    if size > ALL_CAP:
        pytest.skip(f"over the cap: {model_type}: smallest build {size >> 20} MiB")
    return config


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def check_bitwise(model_type: str, auto: Any, smallest: bool = False) -> None:
    config = smallest_config(model_type, auto) if smallest else tiny_config(model_type, auto)
    torch.manual_seed(0)
    eager = auto.from_config(config)
    torch.manual_seed(0)
    deferred = torchdefer.deferred_init(auto.from_config, config)
    torchdefer.materialize_module(deferred)
    assert not torchdefer.is_deferred(deferred)
    eager_state, deferred_state = eager.state_dict(), deferred.state_dict()
    assert eager_state.keys() == deferred_state.keys()
    differ = [k for k, v in eager_state.items() if not bitwise_equal(v, deferred_state[k])]
    assert not differ, f"{model_type}: {len(differ)} of {len(eager_state)} differ: {differ[:5]}"
    # Real, each tensor has the class eager gives it again (Note [Handed-out fakes after
    # deferred_init] in bindings/torchdefer/_stand_ins.py).
    def classes(model):
        return [(n, type(t)) for n, t in (*model.named_parameters(), *model.named_buffers())]

    assert classes(deferred) == classes(eager), model_type


# Architectures for which no candidate config builds within CAP, and why. They are skipped with
# that reason; TORCHDEFER_HF_SWEEP=verify runs them instead and expects NotTiny (strict), which
# is how to refresh this list after upgrading transformers.
NOT_TINY: Dict[str, str] = {
    # An optional library that scripts/dev.sh does not install.
    "conditional_detr": "needs timm",
    "dab-detr": "needs timm",
    "deformable_detr": "needs timm",
    "detr": "needs timm",
    "dinat": "needs natten",
    "edgetam": "needs timm",
    "edgetam_vision_model": "needs timm",
    "fast_vlm": "needs timm",
    "gemma3n": "needs timm",
    "gemma3n_vision": "needs timm",
    "higgs_audio_v2_tokenizer": "needs torchaudio",
    "layoutlmv2": "needs detectron2",
    "omdet-turbo": "needs timm",
    "pe_audio_video": "needs timm",
    "pe_audio_video_encoder": "needs timm",
    "pe_video": "needs timm",
    "pe_video_encoder": "needs timm",
    "perception_lm": "needs timm",
    "table-transformer": "needs timm",
    "timm_backbone": "needs timm",
    "timm_wrapper": "needs timm",
    # transformers 5.23 cannot build its own default config (nor a smaller one) with
    # from_config: an error in the model code, or a required field without a default.
    "autoformer": "ValueError: The `prediction_length` config needs to be specified.",
    "chameleon": "AttributeError: 'NoneType' object has no attribute 'get'",
    "cohere_compass": "KeyError: 'full_attention'",
    "cohere_compass_text": "KeyError: 'full_attention'",
    "dbrx": "AttributeError: 'DbrxAttentionConfig' object has no attribute 'rope_theta'",
    "deepseek_ocr2": "TypeError: 'NoneType' object is not subscriptable",
    "diffusion_gemma": "TypeError: empty(): argument 'size' (position 1) must be tuple of ints,...",
    "dots1": "TypeError: empty() takes 1 positional argument but 3 were given",
    "emu3": "AttributeError: 'NoneType' object has no attribute 'get'",
    "esm": "TypeError: empty(): argument 'size' (position 1) must be tuple of ints, but found e...",
    "evolla": "ValueError: Unrecognized configuration class <class 'transformers.models.evolla....",
    "gemma4_assistant": "StrictDataclassClassValidationError: validate_architecture",
    "gemma4_unified_assistant": "ValueError: The set of layer types producing a cache is differ...",
    "funnel": "TypeError: 'NoneType' object is not iterable",
    "granite4_vision": "TypeError: object of type 'NoneType' has no len()",
    "hunyuan_v1_dense": "TypeError: unsupported operand type(s) for ** or pow(): 'NoneType' and...",
    "hunyuan_v1_moe": "TypeError: unsupported operand type(s) for ** or pow(): 'NoneType' and '...",
    "hunyuan_vl": "TypeError: unsupported operand type(s) for ** or pow(): 'NoneType' and 'float'",
    "hunyuan_vl_text": "TypeError: unsupported operand type(s) for ** or pow(): 'NoneType' and...",
    "informer": "ValueError: The `prediction_length` config needs to be specified.",
    "lfm2_moe": "TypeError: 'NoneType' object is not subscriptable",
    "ministral": "TypeError: unsupported operand type(s) for ** or pow(): 'NoneType' and 'float'",
    "moonshine_streaming": "AttributeError: 'MoonshineStreamingConfig' object has no attribute...",
    "musicgen": "AttributeError: 'MusicgenConfig' object has no attribute 'dropout'",
    "musicgen_melody": "AttributeError: 'MusicgenMelodyConfig' object has no attribute 'dropout'",
    "nemotron": "TypeError: unsupported operand type(s) for //: 'int' and 'NoneType'",
    "pp_ocrv6_medium_det": "TypeError: 'NoneType' object is not subscriptable",
    "t5gemma2_encoder": "AttributeError: 'T5Gemma2TextConfig' object has no attribute 'dropout_...",
    "time_series_transformer": "ValueError: The `prediction_length` config needs to be specified.",
    "voxtral_realtime_text": "ValueError: Could not find VoxtralRealtimeTextModel neither in <m...",
    # Sizes the generic shrink does not reach (vision stages, codec channels, per-layer
    # embeddings, a sub-config the validation ties to the text model) keep it above CAP.
    "align": "238 MiB at the smallest",
    "bark": "122 MiB at the smallest",
    "bit": "89 MiB at the smallest",
    "blt": "734 MiB at the smallest",
    "cohere2_vision": "41 MiB at the smallest",
    "convnext": "106 MiB at the smallest",
    "convnextv2": "106 MiB at the smallest",
    "cosmos3_edge": "72 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "cosmos3_edge_text": "54 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "csm": "6290 MiB at the smallest (smaller: ValueError)",
    "cvt": "74 MiB at the smallest",
    "d_fine": "86 MiB at the smallest",
    "dac": "241 MiB at the smallest",
    "deepseek_v32": "110 MiB at the smallest",
    "deepseek_vl_hybrid": "32 MiB at the smallest",
    "deimv2": "84 MiB at the smallest",
    "depth_pro": "80 MiB at the smallest (smaller: ValueError)",
    "dia": "35 MiB at the smallest",
    "dinov3_convnext": "106 MiB at the smallest",
    "distilbert": "55 MiB at the smallest",
    "donut-swin": "105 MiB at the smallest (smaller: ValueError)",
    "dots3_note": "1093027 MiB at the smallest (smaller: ValueError)",
    "dots3_note_text": "1063435 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "edgetam_video": "124 MiB at the smallest",
    "efficientloftr": "56 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "efficientnet": "244 MiB at the smallest",
    "embedding_gemma2": "95 MiB at the smallest (smaller: ValueError)",
    "encodec": "71 MiB at the smallest",
    "ernie4_5_vl_moe": "112149 MiB at the smallest (smaller: RuntimeError)",
    "fastspeech2_conformer": "35 MiB at the smallest",
    "fastspeech2_conformer_with_hifigan": "106 MiB at the smallest",
    "flaubert": "387 MiB at the smallest",
    "florence2": "350 MiB at the smallest",
    "focalnet": "47 MiB at the smallest",
    "fsmt": "31 MiB at the smallest",
    "fun_asr_nano": "3169 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "gemma3n_text": "9474 MiB at the smallest (smaller: ValueError)",
    "gemma4": "7787 MiB at the smallest (smaller: ValueError)",
    "gemma4_text": "514 MiB at the smallest",
    "gemma4_unified": "101 MiB at the smallest (smaller: ValueError)",
    "glm46v": "148 MiB at the smallest",
    "glm4v": "148 MiB at the smallest",
    "glm4v_moe": "148 MiB at the smallest",
    "glm4v_moe_vision": "147 MiB at the smallest",
    "glm4v_vision": "147 MiB at the smallest",
    "glm5_next": "1194582 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "glm5_next_text": "1192826 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "glm5_next_vision": "194 MiB at the smallest",
    "glm_moe_dsa": "89 MiB at the smallest",
    "glm_ocr": "95 MiB at the smallest",
    "glm_ocr_vision": "95 MiB at the smallest",
    "glmga": "148 MiB at the smallest",
    "gradium_phonon_tts": "175 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "granite_docling": "2074 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "granite_docling_vision": "50 MiB at the smallest",
    "granite_speech": "196 MiB at the smallest",
    "granite_speech_plus": "196 MiB at the smallest",
    "grounding-dino": "58 MiB at the smallest (smaller: ValueError)",
    "hgnet_v2": "51 MiB at the smallest",
    "hiera": "86 MiB at the smallest",
    "hy_v4": "45 MiB at the smallest",
    "inkling2": "2262589 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "inkling2_vision": "76 MiB at the smallest",
    "janus": "452 MiB at the smallest",
    "levit": "33 MiB at the smallest",
    "llama4": "69 MiB at the smallest",
    "longcat_flash": "588 MiB at the smallest",
    "luke": "488 MiB at the smallest",
    "mamba2": "27279 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "mask2former": "99 MiB at the smallest (smaller: IndexError)",
    "maskformer": "101 MiB at the smallest (smaller: IndexError)",
    "maskformer-swin": "105 MiB at the smallest (smaller: ValueError)",
    "mgp-str": "20 MiB at the smallest",
    "mimi": "366 MiB at the smallest (smaller: ValueError)",
    "mimi_decoder": "152 MiB at the smallest (smaller: ValueError)",
    "mimi_encoder": "43 MiB at the smallest",
    "mm-grounding-dino": "58 MiB at the smallest (smaller: ValueError)",
    "molmo2": "90 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "muse_glimmer": "162 MiB at the smallest",
    "muse_spark": "3129506 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "muse_spark_audio": "39 MiB at the smallest",
    "nemo_speechlm": "121989 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "nemotron3_5_asr": "31 MiB at the smallest",
    "nemotron3_5_transcribe_audio": "2785 MiB at the smallest (smaller: StrictDataclassClassVal...",
    "nemotron3_diarization": "378 MiB at the smallest (smaller: StrictDataclassClassValidationE...",
    "nemotron_asr_streaming": "29 MiB at the smallest",
    "neomme": "263 MiB at the smallest (smaller: ValueError)",
    "neucodec": "133 MiB at the smallest",
    "olmo_hybrid": "30 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "oneformer": "75 MiB at the smallest (smaller: IndexError)",
    "parakeet_rnnt": "29 MiB at the smallest",
    "parakeet_tdt": "29 MiB at the smallest",
    "pe_audio": "93 MiB at the smallest",
    "pe_audio_encoder": "93 MiB at the smallest",
    "perceiver": "990 MiB at the smallest",
    "phi4_multimodal": "42 MiB at the smallest",
    "pocket_tts": "303 MiB at the smallest (smaller: StrictDataclassClassValidationError)",
    "pocket_tts_audio_tokenizer": "76 MiB at the smallest (smaller: ValueError)",
    "pocket_tts_audio_tokenizer_decoder": "39 MiB at the smallest (smaller: ValueError)",
    "poolformer": "43 MiB at the smallest",
    "pp_doclayout_v3": "98 MiB at the smallest",
    "pp_doclayout_v4": "97 MiB at the smallest",
    "pp_ocrv5_server_rec": "51 MiB at the smallest",
    "pvt": "48 MiB at the smallest",
    "qwen3_omni_moe_thinker": "39 MiB at the smallest",
    "reformer": "22 MiB at the smallest (smaller: ValueError)",
    "regnet": "74 MiB at the smallest",
    "resnet": "89 MiB at the smallest",
    "roc_bert": "51 MiB at the smallest",
    "rt_detr": "134 MiB at the smallest",
    "rt_detr_v2": "134 MiB at the smallest",
    "sam2": "106 MiB at the smallest",
    "sam2_hiera_det_model": "102 MiB at the smallest",
    "sam2_video": "135 MiB at the smallest",
    "sam2_vision_model": "103 MiB at the smallest",
    "sam3_tracker_video": "41 MiB at the smallest",
    "sam3_video": "54 MiB at the smallest",
    "seamless_m4t": "319 MiB at the smallest",
    "seamless_m4t_v2": "302 MiB at the smallest",
    "squeezebert": "194 MiB at the smallest (smaller: AssertionError)",
    "swin2sr": "46 MiB at the smallest (smaller: ValueError)",
    "swinv2": "105 MiB at the smallest (smaller: ValueError)",
    "textnet": "40 MiB at the smallest",
    "tvp": "169 MiB at the smallest",
    "univnet": "56 MiB at the smallest",
    "unlimited_ocr": "30 MiB at the smallest",
    "uvdoc": "30 MiB at the smallest",
    "vibevoice": "3934 MiB at the smallest",
    "vibevoice_acoustic_tokenizer": "2622 MiB at the smallest",
    "vibevoice_acoustic_tokenizer_decoder": "670 MiB at the smallest",
    "vibevoice_acoustic_tokenizer_encoder": "1311 MiB at the smallest",
    "vibevoice_asr": "2622 MiB at the smallest",
    "vits": "62 MiB at the smallest",
    "vjepa2": "82 MiB at the smallest",
    "xclip": "37 MiB at the smallest",
    "xcodec": "143 MiB at the smallest",
    "xcodec2": "133 MiB at the smallest",
    "xlm": "387 MiB at the smallest",
}
# The same, through AutoModelForCausalLM (a few more build small as a causal LM alone).
NOT_TINY_CAUSAL: List[str] = [
    "blt", "cohere_compass_text", "dbrx", "deepseek_v32", "dots1", "dots3_note", "dots3_note_text",
    "gemma3n", "gemma3n_text", "gemma4", "gemma4_assistant", "gemma4_text", "gemma4_unified",
    "gemma4_unified_assistant", "glm_moe_dsa", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v4",
    "lfm2_moe", "longcat_flash", "mamba2", "ministral", "musicgen", "musicgen_melody", "nemotron",
    "olmo_hybrid", "phi4_multimodal", "reformer", "roc_bert", "xlm",
]
# Builds small, but torchdefer cannot record or replay it (docs/python.md, Known limits), with why.
# Empty now: the drop-path schedules read during construction
# ([x.item() for x in torch.linspace(0, drop_path_rate, depth, device="cpu")], or .tolist()) that
# kept clap, data2vec-vision, glpn, pvt_v2, qianfan_ocr(_vision), seggpt, timesformer and vitdet here
# are read from the recording (Note [Reading values while recording]).
TORCHDEFER_LIMITS: Dict[str, str] = {}


AUTOS = {
    "AutoModel": (transformers.AutoModel, MODEL_MAPPING_NAMES),
    "AutoModelForCausalLM": (transformers.AutoModelForCausalLM, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
}


def cases():
    for auto_name, (_, names) in AUTOS.items():
        causal = auto_name == "AutoModelForCausalLM"
        not_tiny = {k: NOT_TINY[k] for k in NOT_TINY_CAUSAL} if causal else NOT_TINY
        for model_type in sorted(names):
            if ONLY_NOT_TINY and model_type not in not_tiny:
                continue
            marks = []
            listed = model_type in not_tiny and not RUN_ALL  # all: the smallest build runs
            if listed and not VERIFY_EXCLUSIONS:
                marks = [pytest.mark.skip(reason=f"not tiny: {not_tiny[model_type]}")]
            elif listed:
                reason = not_tiny[model_type]
                marks = [pytest.mark.xfail(raises=NotTiny, strict=True, reason=reason)]
            elif model_type in TORCHDEFER_LIMITS:
                reason = TORCHDEFER_LIMITS[model_type]
                marks = [pytest.mark.xfail(raises=RuntimeError, strict=True, reason=reason)]
            yield pytest.param(auto_name, model_type, marks=marks, id=f"{auto_name}-{model_type}")


@pytest.mark.parametrize("auto_name,model_type", list(cases()))
def test_architecture_materializes_to_eager_bitwise(auto_name, model_type):
    causal = auto_name == "AutoModelForCausalLM"
    not_tiny = model_type in (NOT_TINY_CAUSAL if causal else NOT_TINY)
    check_bitwise(model_type, AUTOS[auto_name][0], smallest=RUN_ALL and not_tiny)


def test_the_lists_name_only_architectures_this_transformers_has():
    assert set(NOT_TINY) <= set(MODEL_MAPPING_NAMES) | set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert set(NOT_TINY_CAUSAL) <= set(NOT_TINY) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert set(TORCHDEFER_LIMITS) <= set(MODEL_MAPPING_NAMES) - set(NOT_TINY)
