"""Gaussian-process libraries: GPyTorch models (exact GP with priors on every hyperparameter,
variational GP with learned inducing points) and BoTorch's models, which standardize and
normalize their training data while they are built (transforms whose buffers are computed from
recorded values), with multi-task, mixed categorical and multi-fidelity kernels."""

import gpytorch
import torch
from botorch.models import (KroneckerMultiTaskGP, MixedSingleTaskGP, ModelListGP, MultiTaskGP,
                            SingleTaskGP, SingleTaskMultiFidelityGP, SingleTaskVariationalGP)
from botorch.models.transforms import Normalize, Standardize
from gpytorch.kernels import MaternKernel, ScaleKernel, SpectralMixtureKernel
from gpytorch.priors import GammaPrior
from harness import library_tests

f64 = torch.float64


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self):
        x = torch.randn(20, 3)
        y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(20)
        likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=GammaPrior(1.1, 0.05))
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = ScaleKernel(
            MaternKernel(nu=2.5, ard_num_dims=3, lengthscale_prior=GammaPrior(3.0, 6.0)),
            outputscale_prior=GammaPrior(2.0, 0.15))


class _VariationalGP(gpytorch.models.ApproximateGP):
    def __init__(self):
        inducing = torch.rand(16, 2)
        distribution = gpytorch.variational.CholeskyVariationalDistribution(16)
        strategy = gpytorch.variational.VariationalStrategy(self, inducing, distribution,
                                                             learn_inducing_locations=True)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.LinearMean(2)
        self.covar_module = ScaleKernel(SpectralMixtureKernel(num_mixtures=3, ard_num_dims=2))


def _single_task():
    x = torch.rand(12, 3, dtype=f64)
    y = (x ** 2).sum(-1, keepdim=True) + 0.05 * torch.randn(12, 1, dtype=f64)
    return SingleTaskGP(x, y, input_transform=Normalize(d=3), outcome_transform=Standardize(m=1))


def _multi_task():
    x = torch.cat([torch.rand(10, 2, dtype=f64), torch.randint(0, 2, (10, 1)).to(f64)], -1)
    y = x[:, :1].sin() + 0.1 * torch.randn(10, 1, dtype=f64)
    return MultiTaskGP(x, y, task_feature=-1)


def _mixed_and_fidelity():
    x = torch.rand(10, 3, dtype=f64)
    x[:, 2] = torch.randint(0, 3, (10,)).to(f64)
    y = torch.randn(10, 1, dtype=f64)
    fidelity = SingleTaskMultiFidelityGP(torch.rand(8, 3, dtype=f64), torch.randn(8, 1, dtype=f64),
                                         data_fidelities=[2])
    return ModelListGP(MixedSingleTaskGP(x, y, cat_dims=[2]), fidelity)


def _kronecker_and_variational():
    x, y = torch.rand(8, 2, dtype=f64), torch.randn(8, 3, dtype=f64)
    return torch.nn.ModuleList([KroneckerMultiTaskGP(x, y),
                                SingleTaskVariationalGP(x, y[:, :1], inducing_points=4)])


CASES = {
    "gpytorch/exact-gp-priors": _ExactGP,
    "gpytorch/variational-gp": _VariationalGP,
    "botorch/single-task-transforms": _single_task,
    "botorch/multi-task": _multi_task,
    "botorch/mixed-multi-fidelity": _mixed_and_fidelity,
    "botorch/kronecker-variational": _kronecker_and_variational,
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
