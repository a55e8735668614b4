"""materialize_module(checkpoint=...): what a checkpoint holds is read (this rank's box when
sharding), everything else initialized from the recording as without it (docs/checkpoints.md).
Hugging Face models are built from small configs; nothing is downloaded."""

import json
import os
import pickle
import re
import types

import pytest
import torch
import torchdefer
import transformers  # installed by scripts/dev.sh; a missing one must fail, not skip
from safetensors.torch import load_file, save_file

CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=64,
)


def config(**extra):
    return transformers.LlamaConfig(**CONFIG, **extra)


def add_lora(model, rank=4):
    """LoRA-style adapters on every attention projection, initialized by their own code."""
    for name, module in model.named_modules():
        if name.endswith(("q_proj", "v_proj")):
            module.lora_A = torch.nn.Parameter(torch.empty(rank, module.in_features))
            module.lora_B = torch.nn.Parameter(torch.zeros(module.out_features, rank))
            torch.nn.init.kaiming_uniform_(module.lora_A, a=5**0.5)
    return model


def classifier():
    """A fine-tuning target: the base model's body, a new head and adapters."""
    model = transformers.AutoModelForSequenceClassification.from_config(config(num_labels=3))
    return add_lora(model)


def bitwise_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A causal LM's weights (other values than the fine-tuning target's init) saved by
    save_pretrained once as one file and once split into several."""
    torch.manual_seed(123)
    base = transformers.AutoModelForCausalLM.from_config(config())
    root = tmp_path_factory.mktemp("ckpt")
    base.save_pretrained(root / "single")
    base.save_pretrained(root / "multi", max_shard_size="40KB")
    assert len([f for f in os.listdir(root / "multi") if f.endswith(".safetensors")]) > 2
    weights = load_file(root / "single" / "model.safetensors")
    return root, weights


def body(weights):
    """The checkpoint without the causal LM's head, which the classifier lacks."""
    return {k: v for k, v in weights.items() if k != "lm_head.weight"}


def eager_loaded(weights):
    torch.manual_seed(0)
    eager = classifier()
    missing, unexpected = eager.load_state_dict(body(weights), strict=False)
    assert not unexpected and missing
    return eager


def tensors(model):
    return dict(model.named_parameters()) | dict(model.named_buffers())


@pytest.mark.parametrize("layout", ["single", "multi", "file"])
def test_loaded_tensors_are_the_files_and_missing_ones_eager(saved, layout):
    root, weights = saved
    checkpoint = {"single": root / "single", "multi": root / "multi",
                  "file": root / "single" / "model.safetensors"}[layout]
    expected = tensors(eager_loaded(weights))
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    stats = torchdefer.materialize_module(model, checkpoint=checkpoint, strict=False)
    assert not torchdefer.is_deferred(model)
    sources = {s["name"]: s["source"] for s in stats}
    for name, t in tensors(model).items():
        assert bitwise_equal(t, expected[name]), name
        if name in weights:
            assert bitwise_equal(t, weights[name]) and sources[name] == "checkpoint", name
        elif name in sources:
            assert sources[name] == "init", name
    assert sources["score.weight"] == "init"
    assert sources["model.layers.0.self_attn.q_proj.lora_A"] == "init"


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_a_shard_reads_its_box_and_initializes_the_rest_as_the_full_counter_model(saved, world):
    root, weights = saved
    torch.manual_seed(0)
    full = torchdefer.deferred_init(classifier)
    torchdefer.materialize_module(full, rng="counter")
    full_tensors = tensors(full)
    for rank in range(world):
        torch.manual_seed(0)
        model = torchdefer.deferred_init(classifier)
        stats = torchdefer.materialize_module(
            model, shard=torchdefer.Shard(rank, world), checkpoint=root / "multi", strict=False
        )
        by_name = {s["name"]: s for s in stats}
        for name, t in tensors(model).items():
            info = torchdefer.shard_info(t)
            source = weights[name] if name in weights else full_tensors[name]
            if info is not None:
                start, stop = info["box"]
                source = source[tuple(slice(a, b) for a, b in zip(start, stop))]
            assert bitwise_equal(t, source), (name, rank)
            assert by_name[name]["source"] == ("checkpoint" if name in weights else "init")


def test_a_dcp_checkpoint_loads_whole_and_as_a_box(saved, tmp_path):
    import torch.distributed.checkpoint as dcp

    _, weights = saved
    dcp.save(body(weights), checkpoint_id=str(tmp_path / "dcp"))
    expected = tensors(eager_loaded(weights))
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    stats = torchdefer.materialize_module(model, checkpoint=tmp_path / "dcp")
    for name, t in tensors(model).items():
        assert bitwise_equal(t, expected[name]), name
    assert sum(s["source"] == "checkpoint" for s in stats) == len(body(weights))
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    torchdefer.materialize_module(model, shard=torchdefer.Shard(1, 3), checkpoint=tmp_path / "dcp")
    for name in body(weights):
        t = tensors(model)[name]
        info = torchdefer.shard_info(t)
        box = tuple(slice(a, b) for a, b in zip(*info["box"])) if info else ()
        assert bitwise_equal(t, weights[name][box]), name


class Mixed(torch.nn.Module):
    """Tensors of every rank (0 to 3 dimensions) and a bfloat16 one, for DCP box reads."""

    def __init__(self):
        super().__init__()
        self.cube = torch.nn.Parameter(torch.randn(6, 5, 4))
        self.matrix = torch.nn.Parameter(torch.randn(9, 7))
        self.vector = torch.nn.Parameter(torch.randn(11))
        self.low = torch.nn.Parameter(torch.randn(8, 3).to(torch.bfloat16))
        self.register_buffer("scale", torch.full((), 2.5))


def test_dcp_reads_only_the_boxes_bytes_in_one_load(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(5)
    stored = {k: v.detach().clone() for k, v in Mixed().state_dict().items()}
    stored["low"] = stored["low"].float()  # stored as float32, read into bfloat16
    dcp.save(stored, checkpoint_id=str(tmp_path / "dcp"))
    # Note [Reading boxes of a DCP checkpoint]: no stored chunk is read whole (FileSystemReader's
    # own read_data), and the call is one dcp.load.
    monkeypatch.setattr(dcp.FileSystemReader, "read_data", lambda *a: pytest.fail("whole chunk read"))
    loads = []
    real_load = dcp.load
    monkeypatch.setattr(dcp, "load", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    for shard in [None, torchdefer.Shard(1, 3), torchdefer.Shard(2, 3, dim=1)]:
        loads.clear()
        torch.manual_seed(0)
        model = torchdefer.deferred_init(Mixed)
        stats = torchdefer.materialize_module(model, shard=shard, checkpoint=tmp_path / "dcp")
        assert loads == [1] and all(s["source"] == "checkpoint" for s in stats)
        for name, t in tensors(model).items():
            info = torchdefer.shard_info(t)
            box = tuple(slice(a, b) for a, b in zip(*info["box"])) if info else ()
            assert bitwise_equal(t, stored[name][box].to(t.dtype)), (name, shard)


class _Large(torch.nn.Module):
    """Runs of more than 2 MB (read straight into the destination a step at a time) and two
    tensors of different sizes that cast (read through one shared staging buffer)."""

    def __init__(self):
        super().__init__()
        self.long = torch.nn.Parameter(torch.randn(3 * (1 << 19) + 5))  # 6 MB of float32
        self.wide = torch.nn.Parameter(torch.randn(3, (1 << 19) + 7))  # rows of 2 MB + 28 bytes
        self.low = torch.nn.Parameter(torch.randn(5, 1 << 18).to(torch.bfloat16))
        self.lower = torch.nn.Parameter(torch.randn(7, 3).to(torch.bfloat16))


def test_dcp_reads_large_runs_straight_and_casts_through_one_buffer(tmp_path):
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(6)
    stored = {k: v.detach().clone() for k, v in _Large().state_dict().items()}
    stored["low"], stored["lower"] = stored["low"].float(), stored["lower"].double()
    dcp.save(stored, checkpoint_id=str(tmp_path / "dcp"))
    for shard in [None, torchdefer.Shard(1, 3), torchdefer.Shard(0, 2, dim=1)]:
        torch.manual_seed(0)
        model = torchdefer.deferred_init(_Large)
        torchdefer.materialize_module(model, shard=shard, checkpoint=tmp_path / "dcp")
        for name, t in tensors(model).items():
            info = torchdefer.shard_info(t)
            box = tuple(slice(a, b) for a, b in zip(*info["box"])) if info else ()
            assert bitwise_equal(t, stored[name][box].to(t.dtype)), (name, shard)


class _WithRealTensors(torch.nn.Module):
    """A fake weight, a parameter and a buffer construction makes real (from Python numbers), a
    fake buffer computed from the real parameter, and a fake buffer after them."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.gain = torch.nn.Parameter(torch.tensor([0.5, 2.0, -1.0, 3.0]))  # real
        self.register_buffer("scale", torch.tensor(2.5))  # real
        self.register_buffer("derived", torch.randn(4) * self.gain.detach())  # fake, from gain
        self.register_buffer("noise", torch.randn(3))


def _real_checkpoint():
    return {
        "weight": torch.full((4, 4), 7.0),
        "gain": torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
        "scale": torch.tensor(-1.0),
    }


def test_a_tensor_real_at_record_time_is_loaded_in_place_as_eager_then_load_state_dict():
    torch.manual_seed(0)
    eager = _WithRealTensors()
    eager.load_state_dict(_real_checkpoint(), strict=False)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_WithRealTensors)
    assert not torchdefer.is_fake(model.gain) and not torchdefer.is_fake(model.scale)
    gain, scale, version = model.gain, model.scale, model.gain._version
    stats = torchdefer.materialize_module(model, checkpoint=_real_checkpoint())
    assert model.gain is gain and model.scale is scale and type(model.gain) is torch.nn.Parameter
    assert model.gain._version > version
    for name, t in tensors(model).items():
        assert bitwise_equal(t, tensors(eager)[name]), name  # derived keeps construction's gain
    assert {s["name"]: s["source"] for s in stats} == {
        "weight": "checkpoint", "gain": "checkpoint", "scale": "checkpoint", "derived": "init", "noise": "init"}


def test_a_tensor_real_at_record_time_is_read_as_this_ranks_box_when_sharding():
    torch.manual_seed(0)
    model = torchdefer.deferred_init(_WithRealTensors)
    gain = model.gain
    stats = torchdefer.materialize_module(model, shard=torchdefer.Shard(1, 2), checkpoint=_real_checkpoint())
    assert model.gain is gain and torchdefer.shard_info(model.gain)["box"] == ([2], [4])
    assert bitwise_equal(model.gain, torch.tensor([3.0, 4.0]))
    assert model.scale.item() == -1.0
    assert {s["name"]: s["source"] for s in stats}["gain"] == "checkpoint"


def test_a_failed_read_leaves_tensors_real_at_record_time_as_construction_made_them():
    class Failing(dict):
        def __getitem__(self, name):
            if name == "noise":
                raise OSError("the disk failed reading noise")
            return super().__getitem__(name)

    torch.manual_seed(0)
    model = torchdefer.deferred_init(_WithRealTensors)
    checkpoint = Failing(_real_checkpoint(), noise=torch.zeros(3))
    with pytest.raises(Exception, match="the disk failed reading noise"):
        torchdefer.materialize_module(model, checkpoint=checkpoint)
    assert model.scale.item() == 2.5 and bitwise_equal(model.gain, torch.tensor([0.5, 2.0, -1.0, 3.0]))
    assert all(torchdefer.is_fake(getattr(model, n)) for n in ("weight", "derived", "noise"))


def test_a_tensor_real_at_record_time_a_call_skips_is_refused_by_name_once_and_nothing_loads():
    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 4)
            self.inner = _WithRealTensors()

    model = torchdefer.deferred_init(Outer)
    checkpoint = {"head.weight": torch.ones(4, 4), "inner.scale": torch.tensor(1.0)}
    with pytest.raises(RuntimeError, match=r"holds inner.scale, which construction made real") as error:
        torchdefer.materialize_module(model, checkpoint=checkpoint, check_fn=lambda m: m is not model.inner)
    assert "inner.scale, inner.scale" not in str(error.value)
    assert torchdefer.is_fake(model.head.weight) and model.inner.scale.item() == 2.5


def test_a_mapping_is_cast_to_the_recorded_dtype_and_placed(saved):
    _, weights = saved
    doubled = {k: v.double() for k, v in body(weights).items()}
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    torchdefer.materialize_module(model, checkpoint=doubled, device="cpu")
    for name, value in body(weights).items():
        t = tensors(model)[name]
        assert t.dtype == torch.float32 and bitwise_equal(t, value), name


def test_a_safetensors_file_of_another_dtype_is_cast(tmp_path):
    source = torch.randn(10, 6, dtype=torch.float64)
    save_file({"weight": source, "bias": torch.randn(10).to(torch.bfloat16)},
              tmp_path / "m.safetensors")
    model = torchdefer.deferred_init(torch.nn.Linear, 6, 10)
    torchdefer.materialize_module(model, checkpoint=tmp_path / "m.safetensors",
                                  shard=torchdefer.Shard(1, 3, dim=1))
    assert bitwise_equal(model.weight, source[:, 2:4].float())


def still_fake(model):
    return all(torchdefer.is_fake(t) for t in tensors(model).values())


def test_unexpected_keys_are_an_error_naming_them_when_strict(saved):
    root, _ = saved
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    with pytest.raises(RuntimeError, match=r"lm_head\.weight.*\n.*strict=False"):
        torchdefer.materialize_module(model, checkpoint=root / "single")
    assert still_fake(model)


def test_a_shape_mismatch_is_an_error_naming_the_key_and_loads_nothing(saved):
    _, weights = saved
    bad = body(weights)
    bad["model.norm.weight"] = torch.ones(65)
    bad["model.layers.1.mlp.up_proj.weight"] = torch.ones(3, 3)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    with pytest.raises(RuntimeError, match=r"2 tensor\(s\).*\n.*up_proj.*\[3, 3\].*\n.*norm\.weight"):
        torchdefer.materialize_module(model, checkpoint=bad, shard=torchdefer.Shard(0, 2))
    assert still_fake(model)


def test_a_dtype_that_cannot_be_cast_is_an_error_naming_the_key(saved):
    _, weights = saved
    bad = body(weights)
    bad["model.embed_tokens.weight"] = bad["model.embed_tokens.weight"].to(torch.complex64)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    with pytest.raises(RuntimeError, match=r"embed_tokens\.weight.*ComplexFloat cannot be cast"):
        torchdefer.materialize_module(model, checkpoint=bad)
    assert still_fake(model)


class CountingDict(dict):
    def __init__(self, *args):
        super().__init__(*args)
        self.reads = []

    def __getitem__(self, key):
        self.reads.append(key)
        return super().__getitem__(key)


def test_tied_weights_are_read_once_and_stay_tied():
    gpt2 = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64, n_positions=16)
    torch.manual_seed(0)
    model = torchdefer.deferred_init(transformers.AutoModelForCausalLM.from_config, gpt2)
    assert model.lm_head.weight is model.transformer.wte.weight
    wte = torch.randn(64, 32)
    checkpoint = CountingDict({"transformer.wte.weight": wte, "lm_head.weight": wte.clone()})
    stats = torchdefer.materialize_module(model, checkpoint=checkpoint)
    assert checkpoint.reads.count("transformer.wte.weight") + checkpoint.reads.count("lm_head.weight") == 1
    assert model.lm_head.weight is model.transformer.wte.weight
    assert bitwise_equal(model.lm_head.weight, wte)
    assert [s["source"] for s in stats if s["global_shape"] == [64, 32]] == ["checkpoint"]


class ViewHolder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))
        self.register_buffer("row", self.weight.detach()[0])


def test_a_tensor_sharing_storage_with_another_is_refused():
    model = torchdefer.deferred_init(ViewHolder)
    with pytest.raises(RuntimeError, match="weight shares its storage with row"):
        torchdefer.materialize_module(model, checkpoint={"weight": torch.ones(4, 4)})
    assert torchdefer.is_fake(model.weight) and torchdefer.is_fake(model.row)


def test_check_fn_and_children_first_read_each_tensor_once(saved):
    root, weights = saved
    expected = tensors(eager_loaded(weights))
    torch.manual_seed(0)
    model = torchdefer.deferred_init(classifier)
    layer = model.model.layers[1]
    stats = torchdefer.materialize_module(layer, checkpoint=root / "multi", strict=False,
                                          checkpoint_prefix="model.layers.1.")
    assert {s["source"] for s in stats} == {"checkpoint", "init"}
    stats = torchdefer.materialize_module(model, checkpoint=root / "multi", strict=False,
                                          check_fn=lambda m: m is not model.model.layers[0])
    assert not any(s["name"].startswith("model.layers.1.") for s in stats)
    assert torchdefer.is_deferred(model)
    torchdefer.materialize_module(model.model.layers[0], checkpoint=root / "multi", strict=False,
                                  checkpoint_prefix="model.layers.0.")
    for name, t in tensors(model).items():
        assert bitwise_equal(t, expected[name]), name


def test_bad_checkpoint_arguments_are_refused(tmp_path):
    model = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    with pytest.raises(TypeError, match="checkpoint must be a path"):
        torchdefer.materialize_module(model, checkpoint=3)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        torchdefer.materialize_module(model, checkpoint=tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="holds neither model.safetensors.index.json"):
        torchdefer.materialize_module(model, checkpoint=tmp_path / "empty")
    (tmp_path / "short.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(RuntimeError, match="header length 16 exceeds the file"):
        torchdefer.materialize_module(model, checkpoint=tmp_path / "short.safetensors")
    index = {"weight_map": {"weight": "absent.safetensors"}}
    (tmp_path / "idx").mkdir()
    (tmp_path / "idx" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(RuntimeError, match="cannot open the checkpoint file .*absent"):
        torchdefer.materialize_module(model, checkpoint=tmp_path / "idx")
    assert torchdefer.is_fake(model.weight)


def all_fake(model):
    return all(torchdefer.is_fake(t) for t in tensors(model).values())


def test_a_safetensors_header_that_repeats_a_name_is_refused_naming_it_and_loads_nothing(tmp_path):
    # Written by hand: save_file cannot repeat a name. Each "weight" entry is valid alone.
    weight = '{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}'
    bias = '{"dtype":"F32","shape":[2],"data_offsets":[16,24]}'
    header = f'{{"weight":{weight},"bias":{bias},"weight":{weight}}}'
    path = tmp_path / "repeated.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + bytes(24))
    model = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    expected = rf'the header of {re.escape(str(path))} repeats the key "weight" .*requires unique names'
    with pytest.raises(RuntimeError, match=expected):
        torchdefer.materialize_module(model, checkpoint=path)
    assert all_fake(model)


@pytest.mark.parametrize(
    "content, found",
    [
        (bytes(range(255, -1, -1)), "UnpicklingError"),
        (b"not a checkpoint\n", "UnpicklingError"),
        (pickle.dumps({"weight": torch.zeros(2, 2)}), "dict"),
        (pickle.dumps(types.SimpleNamespace(state_dict_metadata={})), "it holds a SimpleNamespace"),
    ],
    ids=["bytes", "text", "a pickled dict", "another object"],
)
def test_a_dcp_metadata_that_dcp_did_not_write_is_refused_naming_it_and_loads_nothing(
    tmp_path, content, found
):
    import torch.distributed.checkpoint as dcp

    dcp.save({"weight": torch.ones(2, 2), "bias": torch.ones(2)}, checkpoint_id=str(tmp_path / "dcp"))
    metadata = tmp_path / "dcp" / ".metadata"
    metadata.write_bytes(content)
    model = torchdefer.deferred_init(torch.nn.Linear, 2, 2)
    with pytest.raises(RuntimeError) as error:
        torchdefer.materialize_module(model, checkpoint=tmp_path / "dcp")
    message = str(error.value)
    assert f"{metadata} is not a torch.distributed.checkpoint metadata file (" in message
    assert found in message and "torch.distributed.checkpoint.save writes" in message
    assert all_fake(model)


def test_the_checkpoint_benchmark_loads_the_same_bytes_every_way(tmp_path):
    import sys

    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    from bench.harness import checkpoint as bench

    bench.prepare(tmp_path, hidden=64, layers=1)
    results = {s: bench.measure(s, tmp_path, 64, 1) for s in bench.STRATEGIES}
    whole = results["hf-from-pretrained"]["bytes_kept"]
    assert whole == sum(p.stat().st_size for p in bench.safetensors_files(tmp_path)) - sum(
        8 + int.from_bytes(open(p, "rb").read(8), "little") for p in bench.safetensors_files(tmp_path)
    )
    for strategy, result in results.items():
        if strategy.endswith("r0of8"):
            assert result["bytes_kept"] < whole / 4, strategy
        else:
            assert result["bytes_kept"] == whole, strategy
        if strategy.startswith("td-"):
            # The rotary embedding's inv_freq and original_inv_freq: no checkpoint holds them.
            assert result["initialized"] == 2 and result["from_checkpoint"] == 12, strategy


# --- DTensor layouts ----------------------------------------------------------------------------


def fully_sharded_checkpoint_worker(rank, world, path):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from test_distributed import Tower, record

    saved = torch.load(path)
    model = record(Tower, 3)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    stats = torchdefer.materialize_module(model, checkpoint=saved)
    reference = record(Tower, 3)
    torchdefer.materialize_module(reference, rng="counter")
    sources = {s["name"]: s["source"] for s in stats}
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        whole = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        expected = saved[name] if name in saved else dict(reference.state_dict())[name]
        assert torch.equal(whole, expected), name
        assert sources[name] == ("checkpoint" if name in saved else "init"), name


def fsdp2_dcp_worker(rank, world, directory):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from test_distributed import Tower, record

    def sharded(seed):
        model = record(Tower, seed)
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    saved = sharded(12)
    torchdefer.materialize_module(saved, rng="counter")
    dcp.save(saved.state_dict(), checkpoint_id=directory)  # each rank stores its own chunks
    model = sharded(3)
    stats = torchdefer.materialize_module(model, checkpoint=directory)
    assert all(s["source"] == "checkpoint" for s in stats)
    for (name, t), expected in zip(model.state_dict().items(), saved.state_dict().values()):
        assert torch.equal(t.full_tensor() if hasattr(t, "full_tensor") else t,
                           expected.full_tensor() if hasattr(expected, "full_tensor") else expected), name


def test_fsdp2_reads_a_dcp_checkpoint_saved_by_fsdp2_as_its_local_chunks(tmp_path):
    from test_distributed import Tower, record, run_ranks

    run_ranks(tmp_path, 2, fsdp2_dcp_worker, str(tmp_path / "dcp"))
    # The same directory, stored as two chunks per parameter, read whole by one process.
    reference = record(Tower, 12)
    torchdefer.materialize_module(reference, rng="counter")
    model = record(Tower, 3)
    torchdefer.materialize_module(model, checkpoint=tmp_path / "dcp")
    for name, t in tensors(model).items():
        assert torch.equal(t, tensors(reference)[name]), name


def test_a_fully_sharded_model_reads_its_local_shards_and_initializes_the_rest(tmp_path):
    from test_distributed import run_ranks

    torch.manual_seed(11)
    saved = {
        "embed.weight": torch.randn(41, 15),  # uneven: 41 rows over 2 ranks
        "blocks.1.up.weight": torch.randn(30, 15),
        "blocks.2.norm.bias": torch.randn(15),
    }
    torch.save(saved, tmp_path / "saved.pt")
    run_ranks(tmp_path, 2, fully_sharded_checkpoint_worker, str(tmp_path / "saved.pt"))


def test_the_checkpoint_harness_writes_its_section_between_its_markers_and_keeps_the_rest(tmp_path):
    import pathlib
    import sys

    repo = pathlib.Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo))  # bench/ is not installed
    from bench.harness import checkpoint as harness

    results = json.loads((repo / "docs" / "benchmarks-checkpoint.json").read_text())
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n<!-- bench.harness.distributed: begin -->\nkept\n<!-- bench.harness.distributed: end -->\n")
    text = harness.section(results)
    assert text.startswith(harness.BEGIN) and text.rstrip().endswith(harness.END)
    for strategy in harness.STRATEGIES + harness.FSDP2_STRATEGIES:
        assert f"| `{strategy}` |" in text, strategy
    harness.write_section(page, text)
    harness.write_section(page, text)  # replaced, not appended again
    written = page.read_text()
    assert written.count(harness.BEGIN) == 1 and "kept\n" in written
    assert written.index("bench.harness.distributed: end") < written.index(harness.BEGIN)
