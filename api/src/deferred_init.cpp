// deferred_init's entry points: every recording is opened here, with the replay engine as its value
// reader (Note [Who reads values]), and the public questions about recordings are answered by
// the recorder.
#include <torchdefer/deferred_init.h>
#include <torchdefer/recording.h>

#include "materialization.h"

#include <ATen/Context.h>

#include <memory>
#include <string>
#include <utility>

namespace torchdefer {

namespace {

bool draws_cuda_from_cuda(CudaDraws draws) {
  if (draws == CudaDraws::kAuto) {
    return at::globalContext().hasCUDA();
  }
  return draws == CudaDraws::kCudaGenerator;
}

}  // namespace

DeferredInitGuard::DeferredInitGuard(std::string context, DeferredInitOptions options)
    : recording_(std::make_unique<detail::Recording>(std::move(context), options.exact_generator(),
                                                     draws_cuda_from_cuda(options.cuda_draws()),
                                                     &detail::read_recorded_values)) {}

DeferredInitGuard::~DeferredInitGuard() = default;

at::Tensor read_values(const at::Tensor& t) { return detail::read_values(t); }

std::string explain(const at::Tensor& t) { return detail::explain(t); }

}  // namespace torchdefer
