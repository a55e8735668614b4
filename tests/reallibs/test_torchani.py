"""TorchANI's neural-network potentials as its builders assemble them from symbols and a level
of theory (never the released weights): an ensemble of per-element atomic networks behind an
atomic environment vector computer whose radial and angular shift buffers cover the cutoff
linearly, self energies and a repulsion potential from its shipped constants, and the same with
networks shared across elements."""

from harness import library_tests
from torchani.arch import simple_ani

_SYMBOLS = ("H", "C", "N", "O")

CASES = {
    "torchani/ani-ensemble": lambda: simple_ani(
        _SYMBOLS, "wb97x-631gd", ensemble_size=2, radial_shifts=8, angular_shifts=4,
        sections=2, strategy="pyaev"),
    "torchani/ani-shared-networks": lambda: simple_ani(
        _SYMBOLS, "wb97x-631gd", container="ANISharedNetworks", radial_shifts=8,
        angular_shifts=4, sections=2, strategy="pyaev", repulsion=False, cutoff_fn="cosine"),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
