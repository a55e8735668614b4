"""Stable-Baselines3 and sb3-contrib policies as their algorithms build them, from gymnasium
spaces: actor-critic policies with orthogonal initialization (gains per head), a state-dependent
exploration policy (its noise matrix sampled from a learned log-std while building), a CNN
policy that shapes its flatten layer by a forward of a sampled observation, DQN and SAC policies
whose target networks load the online networks' state dicts, and sb3-contrib's recurrent
actor-critic (LSTMs), quantile-regression DQN, TQC critics and CrossQ (batch renormalization).
Each policy also makes its Adam optimizer over the parameters, as the algorithms do."""

import gymnasium as gym
import numpy as np
import torch
from harness import library_tests
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from sb3_contrib.crossq.policies import CrossQPolicy
from sb3_contrib.qrdqn.policies import QRDQNPolicy
from sb3_contrib.tqc.policies import TQCPolicy
from stable_baselines3.common.policies import ActorCriticCnnPolicy, ActorCriticPolicy
from stable_baselines3.dqn.policies import DQNPolicy
from stable_baselines3.sac.policies import SACPolicy

_OBS = gym.spaces.Box(-1.0, 1.0, (6,), dtype=np.float32)
_DISCRETE = gym.spaces.Discrete(4)
_BOX = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
_IMAGE = gym.spaces.Box(0, 255, (3, 36, 36), dtype=np.uint8)


def _lr(_):
    return 3e-4


def _gsde():
    policy = ActorCriticPolicy(_OBS, _BOX, _lr, net_arch=[32], use_sde=True, log_std_init=-1.0,
                               full_std=True)
    # The exploration matrix lives on the action distribution, which is not a module: held as a
    # buffer here, so that the checks compare it too.
    policy.register_buffer("exploration_mat", policy.action_dist.exploration_mat.detach(),
                           persistent=False)
    return policy


CASES = {
    "stable-baselines3/ppo-ortho-init": lambda: ActorCriticPolicy(
        _OBS, _DISCRETE, _lr, net_arch=dict(pi=[32, 32], vf=[32, 16]), ortho_init=True),
    "stable-baselines3/ppo-gsde": _gsde,
    "stable-baselines3/ppo-cnn": lambda: ActorCriticCnnPolicy(
        _IMAGE, _DISCRETE, _lr, features_extractor_kwargs=dict(features_dim=32),
        net_arch=[16]),
    "stable-baselines3/dqn-sac-targets": lambda: torch.nn.ModuleList([
        DQNPolicy(_OBS, _DISCRETE, _lr, net_arch=[32, 32]),
        SACPolicy(_OBS, _BOX, _lr, net_arch=[32, 32], n_critics=2)]),
    "sb3-contrib/recurrent-ppo": lambda: RecurrentActorCriticPolicy(
        _OBS, _DISCRETE, _lr, net_arch=[16], lstm_hidden_size=16, n_lstm_layers=2,
        ortho_init=True),
    "sb3-contrib/qrdqn-tqc-crossq": lambda: torch.nn.ModuleList([
        QRDQNPolicy(_OBS, _DISCRETE, _lr, n_quantiles=8, net_arch=[32]),
        TQCPolicy(_OBS, _BOX, _lr, net_arch=[32], n_quantiles=5, n_critics=2),
        CrossQPolicy(_OBS, _BOX, _lr, net_arch=[32], n_critics=2)]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
