"""The failures this suite has found, keyed by (case, check), with the class of issue #11 (or the
item of issue #29) they belong to and a minimal repro. The runner labels failures with it; it
marks nothing as expected: a listed failure still fails the run, and report.py names listed
cases that pass."""

from typing import Dict, Tuple

# Issue 29 item 1: inside deferred_init, Module.to_empty(device="cpu") of a model built under
# torch.device("meta") calls torch.empty_like(meta_tensor, device="cpu"), which returns a real
# tensor; the library's init then runs for real on it, and nothing of the model is deferred.
_TO_EMPTY = ("issue 29 item 1: to_empty makes real tensors while recording", """
def flow():
    with torch.device("meta"):
        m = torch.nn.Linear(4, 4)
    return m.to_empty(device="cpu")
torchdefer.is_fake(torchdefer.deferred_init(flow).weight)  # False
""")

KNOWN: Dict[Tuple[str, str], Tuple[str, str]] = {
    (case, "fake"): _TO_EMPTY for case in (
        "torchtitan/trainer-flow-llama3",
        "torchtitan/trainer-flow-llama3-gqa-tied",
        "litgpt/trainer-flow-llama-3.2-meta",
        "ai2-olmo-core/trainer-flow-olmo2",
        "ai2-olmo-core/trainer-flow-olmo2-llama-depth-init",
        "ai2-olmo-core/trainer-flow-moe",
    )
}
