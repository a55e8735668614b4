"""Pyro: PyroModules with PyroParams behind constraints (positive, correlation Cholesky) and
PyroSample priors on a torch layer, normalizing-flow transforms (autoregressive networks with
random permutations, splines, Sylvester with orthogonal parts, block autoregressive), and
autoguides whose parameters are created by their first call, from samples of the model's prior.

Pyro keeps parameters in a process-wide store that a new module reads by name: each case clears
it first, as Pyro's own examples do before a model is built, so that every construction makes
its own parameters."""

import pyro
import pyro.distributions as dist
import pyro.distributions.transforms as T
import torch
from harness import library_tests
from pyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoMultivariateNormal, AutoNormal
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch.distributions import constraints


class _BayesianLinear(PyroModule):
    def __init__(self):
        super().__init__()
        self.linear = PyroModule[torch.nn.Linear](3, 4)
        self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([4, 3]).to_event(2))
        self.scale = PyroParam(torch.rand(4) + 0.5, constraint=constraints.positive)
        self.corr = PyroParam(torch.eye(3), constraint=constraints.corr_cholesky)


def _bayesian_linear():
    pyro.clear_param_store()
    return _BayesianLinear()


def _transforms():
    pyro.clear_param_store()
    return torch.nn.ModuleList([
        T.affine_autoregressive(5, hidden_dims=[16]), T.spline_coupling(4, count_bins=4),
        T.neural_autoregressive(3, hidden_dims=[8]), T.householder(4, count_transforms=2),
        T.sylvester(4, count_transforms=2), T.planar(3), T.radial(3), T.block_autoregressive(3),
        T.affine_coupling(4), T.generalized_channel_permute(channels=3)])


def _model():
    loc = pyro.sample("loc", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    scale = pyro.sample("scale", dist.LogNormal(0.0, 1.0))
    with pyro.plate("data", 5):
        pyro.sample("obs", dist.Normal(loc.sum(), scale), obs=torch.ones(5))


def _autoguides():
    pyro.clear_param_store()
    guides = torch.nn.ModuleList([AutoNormal(_model), AutoMultivariateNormal(_model),
                                  AutoLowRankMultivariateNormal(_model, rank=2)])
    for guide in guides:
        guide()  # creates the parameters, initialized to the median of prior samples
    return guides


CASES = {
    "pyro-ppl/pyro-module-params-samples": _bayesian_linear,
    "pyro-ppl/flow-transforms": _transforms,
    "pyro-ppl/autoguides-from-prior": _autoguides,
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
