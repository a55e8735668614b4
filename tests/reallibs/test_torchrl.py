"""TorchRL and TensorDict: RL networks (MLP with layer norms, a dueling CNN Q-network whose lazy
layers are shaped by a first batch, noisy linear layers with factorized noise buffers, batch
renormalization, an LSTM module), loss modules that keep their networks' parameters in
TensorDictParams and clone target networks from them (DQN with a delayed target, SAC with two
Q-networks), and TensorDictParams built from a module by hand."""

import torch
from harness import library_tests
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictParams
from torchrl.modules import (MLP, BatchRenorm1d, DuelingCnnDQNet, LSTMModule, NoisyLinear,
                             ProbabilisticActor, QValueActor, TanhNormal, ValueOperator)
from torchrl.objectives import DQNLoss, SACLoss


def _networks():
    dueling = DuelingCnnDQNet(out_features=4, mlp_kwargs={"num_cells": [16]},
                              cnn_kwargs={"num_cells": [4, 8], "kernel_sizes": [3, 3],
                                          "strides": [1, 1]})
    dueling(torch.randn(2, 3, 8, 8))  # lazy layers take their shapes from a first batch
    return torch.nn.ModuleList([
        dueling, MLP(in_features=4, out_features=3, num_cells=[16, 16],
                     norm_class=torch.nn.LayerNorm, norm_kwargs={"normalized_shape": 16}),
        NoisyLinear(6, 5), BatchRenorm1d(6),
        LSTMModule(input_size=4, hidden_size=8, in_key="x", out_key="y")])


# LossModule.named_parameters hides the target networks' parameters and takes no
# remove_duplicate argument: the cases hold each loss in a ModuleList, whose walk sees them all.
def _dqn_loss():
    actor = QValueActor(MLP(in_features=4, out_features=3, num_cells=[16]),
                        in_keys=["observation"], spec=None, action_space="one-hot")
    return torch.nn.ModuleList([DQNLoss(actor, delay_value=True, action_space="one-hot")])


class _Q(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = MLP(in_features=6, out_features=1, num_cells=[16])

    def forward(self, observation, action):
        return self.mlp(torch.cat([observation, action], -1))


def _sac_loss():
    net = torch.nn.Sequential(MLP(in_features=4, out_features=4, num_cells=[16]),
                              NormalParamExtractor())
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=TanhNormal)
    qvalue = ValueOperator(_Q(), in_keys=["observation", "action"])
    return torch.nn.ModuleList([SACLoss(actor, qvalue, num_qvalue_nets=2, action_spec=None)])


class _ParamsAndTarget(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                       torch.nn.Linear(8, 2))
        self.params = TensorDictParams(TensorDict.from_module(self.net))
        self.target = TensorDictParams(self.params.data.clone(), no_convert=True)


CASES = {
    "torchrl/networks-noisy-lazy": _networks,
    "torchrl/dqn-loss-target": _dqn_loss,
    "torchrl/sac-loss-two-q": _sac_loss,
    "tensordict/params-and-target": _ParamsAndTarget,
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
