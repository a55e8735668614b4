"""Normalizing flows and neural ODEs: zuko (masked autoregressive flows whose masks come from a
random order, splines, continuous flows, a Gaussian mixture initialized by k-means++ from
recorded data), normflows (Glow's invertible 1x1 convolutions from the QR and LU of a random
matrix, data-dependent ActNorm, random permutations by scatter), nflows (random MADE masks, LU,
QR, SVD and Householder linear maps) and torchdiffeq (a buffer that is an ODE solution)."""

import normflows as nf
import torch
import zuko
from harness import library_tests
from nflows import distributions as nflows_distributions
from nflows import flows as nflows_flows
from nflows import transforms as T
from torchdiffeq import odeint


def _zuko_gmm():
    gmm = zuko.mixtures.GMM(features=3, components=4)
    gmm.initialize(torch.randn(64, 3), strategy="kmeans++")  # value-dependent loops
    return gmm


def _glow():
    return torch.nn.ModuleList([
        nf.flows.GlowBlock(4, 16, split_mode="channel", scale=True, use_lu=True),
        nf.flows.Invertible1x1Conv(4, use_lu=False), nf.flows.GlowBlock(4, 16, use_lu=False)])


def _real_nvp():
    flows = []
    for i in range(3):
        mask = torch.tensor([1, 0, 1, 0]) if i % 2 else torch.tensor([0, 1, 0, 1])
        nets = [nf.nets.MLP([4, 16, 4], init_zeros=True) for _ in range(2)]
        flows += [nf.flows.MaskedAffineFlow(mask, *nets), nf.flows.ActNorm(4),
                  nf.flows.Permute(4, mode="shuffle")]
    return nf.NormalizingFlow(nf.distributions.base.DiagGaussian(4), flows)


def _splines():
    # GaussianMixture draws its default means from NumPy's global generator: given here.
    base = nf.distributions.base.GaussianMixture(3, 3, loc=torch.randn(3, 3).tolist(),
                                                 trainable=True)
    flows = [nf.flows.AutoregressiveRationalQuadraticSpline(3, 2, 16),
             nf.flows.CoupledRationalQuadraticSpline(3, 2, 16), nf.flows.LULinearPermute(3),
             nf.flows.Planar((3,)), nf.flows.Radial((3,))]
    return nf.NormalizingFlow(base, flows)


def _nflows():
    transform = T.CompositeTransform([
        T.MaskedAffineAutoregressiveTransform(features=4, hidden_features=16, num_blocks=2,
                                              random_mask=True, use_residual_blocks=False),
        T.RandomPermutation(4), T.LULinear(4, identity_init=False),
        T.MaskedPiecewiseRationalQuadraticAutoregressiveTransform(features=4, hidden_features=8,
                                                                  num_bins=4),
        T.ReversePermutation(4), T.HouseholderSequence(4, 2), T.SVDLinear(4, 2), T.QRLinear(4, 2),
        T.BatchNorm(4), T.ActNorm(4)])
    return nflows_flows.Flow(transform, nflows_distributions.StandardNormal([4]))


class _Dynamics(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 3))

    def forward(self, t, y):
        return self.net(y)


class _OdeState(torch.nn.Module):
    """A buffer that is the solution at t=1 of an adaptive-step ODE from a random start."""

    def __init__(self):
        super().__init__()
        self.dynamics = _Dynamics()
        y = odeint(self.dynamics, torch.randn(2, 3), torch.tensor([0.0, 1.0]), method="dopri5")
        self.register_buffer("y1", y[-1].detach())


CASES = {
    "zuko/maf-randperm-context": lambda: zuko.flows.MAF(features=5, context=3, transforms=3,
                                                        hidden_features=(16, 16), randperm=True),
    "zuko/nsf": lambda: zuko.flows.NSF(features=4, bins=6, transforms=2, hidden_features=(16,)),
    "zuko/nice-cnf-naf-sospf-gf": lambda: torch.nn.ModuleList([
        zuko.flows.NICE(4, 2, transforms=2), zuko.flows.CNF(3, 2, hidden_features=(8, 8)),
        zuko.flows.NAF(3, 0, transforms=1, hidden_features=(8,)),
        zuko.flows.SOSPF(3, transforms=1, hidden_features=(8,)), zuko.flows.GF(3, transforms=2)]),
    "zuko/gmm-kmeans++": _zuko_gmm,
    "normflows/glow-lu": _glow,
    "normflows/realnvp-actnorm": _real_nvp,
    "normflows/splines-mixture": _splines,
    "nflows/maf-lu-qr-svd": _nflows,
    "torchdiffeq/ode-solution-buffer": _OdeState,
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
