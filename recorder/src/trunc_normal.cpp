// torchdefer::trunc_normal_: torch.nn.init.trunc_normal_ as one operator, so that recording sees
// one random op instead of a rejection loop whose length depends on the values drawn.
#include "recorder_kernels.h"

#include <ATen/ATen.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace torchdefer::detail {
namespace {

// Note [trunc_normal_ as one operator]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// PyTorch 2.13's torch.nn.init.trunc_normal_ is a rejection sampler written in Python: it draws,
// checks which values fall outside [a, b] (reading them), and draws again for those, so how many
// numbers it takes from the generator depends on the numbers. Recorded op by op, each check would
// be a value read and the recording would hold one branch of the loop. The package records the
// whole call as this one operator instead (Note [What recording changes, and where] in
// bindings/torchdefer/_recording.py), tagged nondeterministic_seeded like ATen's random ops, so the
// recorder treats it as a random op whose draws it cannot count (Note [Torch-mode draw offsets]).
//
// The kernel below is the sampler's algorithm as a sequence of ATen calls, in the same order and
// with the same scalar arguments as torch's Python code, so that on every device it takes the same
// draws and gives the same bits as torch.nn.init.trunc_normal_ with the same generator: the
// normal_-and-redraw loop when the interval holds more than 30% of the mass, otherwise uniform
// candidates accepted against the log density. Under deferred_init the recorder places it without
// running it (Note [Lazy RNG anchors]), runs it on a scratch tensor when the generator state after
// it is first needed, and replays it in torch mode; counter mode samples the same distribution its
// own way (Note [Counter-mode truncated normal]). Given a generator (trainers pass theirs to every
// init), it draws from that one, as torch's does, and the recorder follows it (Note [Followed
// generators]). On meta tensors (the Fake layer's shadows) it only returns `self`.

double normal_cdf(double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; }

// The bound `value` as the tensor's dtype holds it, so that the rejection test compares the values
// the tensor can represent (torch reads it back through a one-element tensor of that dtype).
at::Scalar representable(double value, const at::Tensor& like) {
  return at::scalar_tensor(value, at::TensorOptions().dtype(like.scalar_type())).item();
}

void redraw_normal_outside(at::Tensor& self, double mean, double std, double a, double b,
                           const std::optional<at::Generator>& generator) {
  const at::Scalar low = representable(a, self);
  const at::Scalar high = representable(b, self);
  at::Tensor result = self.normal_(mean, std, generator);
  while (true) {
    const at::Tensor outside = result.lt(low).bitwise_or(result.gt(high));
    if (!outside.any().item<bool>()) {
      break;
    }
    result = at::where(outside, at::empty_like(result).normal_(mean, std, generator), result);
  }
  if (!result.is_same(self)) {
    self.copy_(result);
  }
}

// Turns uniform candidates into log(pdf(x) / pdf(mode)), the acceptance threshold.
void log_density_ratio_(at::Tensor& candidates, double mean, double std, double log_peak) {
  candidates.sub_(mean).div_(std).pow_(2).mul_(-0.5).sub_(log_peak);
}

void accept_uniform_candidates(at::Tensor& self, double mean, double std, double a, double b,
                               const std::optional<at::Generator>& generator) {
  const double mode = std::max(a, std::min(mean, b));
  const double log_peak = -0.5 * std::pow((mode - mean) / std, 2.0);
  at::Tensor candidates = at::empty_like(self);
  at::Tensor accept = at::empty_like(self);
  self.uniform_(a, b, generator);
  candidates.copy_(self);
  log_density_ratio_(candidates, mean, std, log_peak);
  at::Tensor pending = accept.uniform_(0, 1, generator).log_().gt(candidates);
  if (!pending.any().item<bool>()) {
    return;
  }
  at::Tensor result = self;
  while (true) {
    candidates.uniform_(a, b, generator);
    result = at::where(pending, candidates, result);
    log_density_ratio_(candidates, mean, std, log_peak);
    pending = at::where(pending, accept.uniform_(0, 1, generator).log_().gt(candidates), pending);
    if (!pending.any().item<bool>()) {
      break;
    }
  }
  self.copy_(result);
}

}  // namespace

at::Tensor& trunc_normal_kernel(at::Tensor& self, double mean, double std, double a, double b,
                                std::optional<at::Generator> generator) {
  if (self.is_meta()) {
    return self;
  }
  at::NoGradGuard no_grad;
  const double mass = normal_cdf((b - mean) / std) - normal_cdf((a - mean) / std);
  if (mass > 0.3) {
    redraw_normal_outside(self, mean, std, a, b, generator);
  } else {
    accept_uniform_candidates(self, mean, std, a, b, generator);
  }
  return self;
}

}  // namespace torchdefer::detail
