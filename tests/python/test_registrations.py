"""Loading torchdefer adds dispatcher kernels only where torch has none, a DeferredInit
fallthrough to ops without a composite kernel, and no device guard (Note [What loading torchdefer
changes], Note [Where an op is recorded])."""

import json
import subprocess
import sys
import textwrap

_PROBE = textwrap.dedent(
    """
    import json, torch

    FALLTHROUGH = "DeferredInit: torchdefer: recorded at the Fake key"

    def registrations():
        result = {}
        for name in torch._C._dispatch_get_all_op_names():
            dump = torch._C._dispatch_dump(name).splitlines()
            result[name] = {
                "meta": torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"),
                "composite": torch._C._dispatch_has_kernel_for_dispatch_key(
                    name, "CompositeImplicitAutograd"),
                "falls_through": any(line.startswith(FALLTHROUGH) for line in dump),
                "dump": [line for line in dump if not line.startswith(FALLTHROUGH)],
            }
        return result

    def guarded_device_types():
        # A stream asks the device type's guard; without one, torch says it is "not linked with
        # support" for that device type, with a stand-in guard it says something else.
        answers = {}
        for device_type in ("cuda", "xpu", "mps", "hpu", "mtia", "privateuseone"):
            try:
                torch.Stream(device=device_type)
                answers[device_type] = "a stream"
            except Exception as e:
                answers[device_type] = str(e)
        return answers

    before, guards_before = registrations(), guarded_device_types()
    import torchdefer
    after, guards_after = registrations(), guarded_device_types()
    changed = {
        name: {"meta_before": before[name]["meta"], "meta_after": after[name]["meta"]}
        for name in before
        if before[name]["dump"] != after[name]["dump"]
    }
    print(json.dumps({
        "changed": changed,
        "fall_through": {
            name: after[name]["composite"] for name in after if after[name]["falls_through"]
        },
        "composite_kept": sorted(
            name for name in after if after[name]["composite"] and name.startswith("aten::")
        ),
        "new_ops": sorted(set(after) - set(before)),
        "missing_ops": sorted(set(before) - set(after)),
        "guards_before": guards_before,
        "guards_after": guards_after,
    }))
    """
)


def _probe():
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_import_changes_torch_ops_only_by_meta_kernels_where_none_existed_and_adds_no_guard():
    result = _probe()
    # A torch op may change only by gaining a Meta kernel where it had none; torch's Python meta
    # kernels cover nearly every op with a meta rule.
    changed = result["changed"]
    assert changed, "expected at least one meta rule where torch's Python has none"
    assert [n for n, c in changed.items() if c["meta_before"] or not c["meta_after"]] == []
    assert all(name.startswith("aten::") for name in changed)
    assert result["missing_ops"] == []
    assert [name for name in result["new_ops"] if not name.startswith("torchdefer::")] == []
    assert result["guards_after"] == result["guards_before"]


def test_import_records_every_op_without_a_composite_kernel_at_the_fake_key():
    result = _probe()
    falls_through = result["fall_through"]
    assert "aten::uniform_" in falls_through and "aten::empty.memory_format" in falls_through
    assert [name for name, composite in falls_through.items() if composite] == []
    assert "aten::linear" in result["composite_kept"]
    assert not set(result["composite_kept"]) & set(falls_through)
    assert not [name for name in falls_through if name.startswith("torchdefer::")]
