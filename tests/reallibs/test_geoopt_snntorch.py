"""Riemannian and spiking model code: geoopt's manifold parameters (`ManifoldParameter`, a
Parameter subclass that carries its manifold) initialized on the Stiefel manifold (QR of a
Gaussian), the sphere, the Poincare ball (wrapped normal samples) and SPD matrices, and its
hyperplane-distance layer; snntorch's spiking neurons with learnable decay and threshold buffers
(Leaky, Synaptic, Alpha, recurrent RLeaky and RSynaptic with their own linear and convolutional
feedback), and its spiking convolutional LSTM."""

import geoopt
import snntorch as snn
import torch
from geoopt.layers.stereographic import Distance2StereographicHyperplanes
from harness import library_tests


class _Manifolds(torch.nn.Module):
    def __init__(self):
        super().__init__()
        stiefel, sphere = geoopt.Stiefel(), geoopt.Sphere()
        self.stiefel = geoopt.ManifoldParameter(stiefel.random(6, 3), manifold=stiefel)
        self.sphere = geoopt.ManifoldParameter(sphere.random(4, 5), manifold=sphere)
        ball = geoopt.PoincareBall(c=0.5, learnable=True)
        self.ball = ball
        self.points = geoopt.ManifoldParameter(ball.random_normal(8, 3, std=0.3), manifold=ball)
        spd = geoopt.SymmetricPositiveDefinite()
        self.spd = geoopt.ManifoldParameter(spd.random(3, 4, 4), manifold=spd)
        self.hyperplanes = Distance2StereographicHyperplanes(
            plane_shape=3, num_planes=5, ball=ball)


CASES = {
    "geoopt/manifold-parameters": _Manifolds,
    "snntorch/neurons": lambda: torch.nn.ModuleList([
        snn.Leaky(beta=0.9, learn_beta=True, learn_threshold=True),
        snn.Synaptic(alpha=0.8, beta=0.7, learn_alpha=True),
        snn.Alpha(alpha=0.9, beta=0.8),
        snn.RLeaky(beta=torch.rand(8), linear_features=8, learn_recurrent=True),
        snn.RSynaptic(alpha=0.9, beta=0.8, conv2d_channels=4, kernel_size=3),
        snn.SConv2dLSTM(in_channels=2, out_channels=4, kernel_size=3)]),
}


test_torch_mode_equals_eager, test_shards_concatenate_to_the_full_counter_model = (
    library_tests(CASES))
