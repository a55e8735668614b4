"""NequIP, E(3)-equivariant interatomic potentials on e3nn: the model builder seeds its own
generator inside Lightning's isolate_rng() and restores the caller's afterwards, builds in float64
under a default-dtype context, and holds per-type energy scales and shifts, Bessel radial bases
and a polynomial cutoff as buffers."""

import torch
from harness import library_tests
from nequip.model import NequIPGNNModel
from nequip.utils.global_state import set_global_state

# NequIP refuses to build before its process-wide state is set, which also makes float64 the
# default dtype of the whole process: the other libraries' cases run in this process after it.
_dtype = torch.get_default_dtype()
set_global_state()
torch.set_default_dtype(_dtype)


def _nequip():
    return NequIPGNNModel(
        seed=123, model_dtype="float64", type_names=["H", "C", "O"], r_max=4.0, num_layers=2,
        l_max=1, num_features=8, radial_mlp_width=16, num_bessels=4, avg_num_neighbors=5.0,
        per_type_energy_scales={"H": 1.0, "C": 2.0, "O": 3.0},
        per_type_energy_shifts={"H": -0.5, "C": -1.0, "O": -2.0})


CASES = {"nequip/gnn-seeded-in-isolate-rng": _nequip}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
