"""ncps' liquid networks: closed-form continuous-time (CfC) and liquid time-constant (LTC)
networks over neural circuit policy wirings (sparsity masks as buffers from wirings drawn with
numpy seeds, per-parameter uniform init ranges), CfC's backbone, pure and mixed-memory modes."""

import torch
from harness import library_tests
from ncps.torch import CfC, LTC
from ncps.wirings import NCP, AutoNCP, FullyConnected

CASES = {
    "ncps/cfc-ltc-ncp": lambda: torch.nn.ModuleList([
        CfC(8, AutoNCP(16, 4, seed=5), batch_first=True),
        LTC(8, NCP(inter_neurons=6, command_neurons=4, motor_neurons=2, sensory_fanout=3,
                   inter_fanout=2, recurrent_command_synapses=3, motor_fanin=2, seed=1))]),
    "ncps/cfc-modes": lambda: torch.nn.ModuleList([
        CfC(6, 12, proj_size=3, mode="default", backbone_units=16, backbone_layers=2),
        CfC(6, 12, mode="pure", mixed_memory=True),
        LTC(6, FullyConnected(8, 3), ode_unfolds=4)]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
