"""The failures this suite has found, keyed by (case, check), with the class of issue #11 they
belong to and a minimal repro. The runner labels failures with it; it marks nothing as
expected: a listed failure still fails the run, and report.py names listed cases that pass."""

from typing import Dict, Tuple

KNOWN: Dict[Tuple[str, str], Tuple[str, str]] = {
    # PEFT's VeRA draws its shared projections from torch.Generator().manual_seed(key): eager's
    # values are fixed by that generator, but torch RNG mode refuses any explicit generator, and
    # only at materialization (deferred_init accepts it; counter mode and shards work).
    #   def build(): lin = nn.Linear(4, 4); nn.init.kaiming_uniform_(lin.weight,
    #                    generator=torch.Generator().manual_seed(0)); return lin
    #   materialize_module(deferred_init(build))  -> RuntimeError
    ("peft/vera", "torch mode"): (
        "NEW 15: explicit torch.Generator refused late in torch mode",
        "nn.init.kaiming_uniform_(w, generator=torch.Generator().manual_seed(0))"),
}
