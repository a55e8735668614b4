"""Loading torchdefer adds dispatcher kernels only where torch has none, and no device guard
(Note [What loading torchdefer changes])."""

import json
import subprocess
import sys
import textwrap

_PROBE = textwrap.dedent(
    """
    import json, torch

    def registrations():
        return {
            name: {
                "meta": torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"),
                "dump": torch._C._dispatch_dump(name),
            }
            for name in torch._C._dispatch_get_all_op_names()
        }

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
