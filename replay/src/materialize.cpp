// The public materialization API: tensors and torch::nn modules.
#include <torchdefer/fake_tensor.h>
#include <torchdefer/materialize.h>

#include <torch/nn/module.h>

#include <string>
#include <unordered_set>
#include <vector>

#include "replay.h"

namespace torchdefer {
namespace {

// The fake parameters and buffers materialize_module reaches, each TensorImpl once.
class ModuleTensors {
 public:
  explicit ModuleTensors(const MaterializeOptions& options) : options_(options) {}

  // Note [Nested materialization]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // FSDP wraps and materializes a model bottom-up: `layers[3]` first, then its parent, which
  // must not touch `layers[3]` again (to_empty() + reset_parameters() would clobber it). Here
  // only fakes are collected, so a materialized child is left exactly as it is; a parent's
  // tensors that share storage with it (tied weights) are made views of the child's real storage
  // rather than recomputed. check_fn(child) == false skips a child's whole subtree; the root's
  // own tensors are always included.
  void collect(const torch::nn::Module& module, bool is_root) {
    if (!is_root && options_.check_fn() && !options_.check_fn()(module)) {
      return;
    }
    for (const auto& child : module.children()) {
      collect(*child, /*is_root=*/false);
    }
    if (!options_.buffers_only()) {
      for (const at::Tensor& p : module.parameters(/*recurse=*/false)) {
        add(p);
      }
    }
    for (const at::Tensor& b : module.buffers(/*recurse=*/false)) {
      add(b);
    }
  }

  const std::vector<at::Tensor>& tensors() const { return tensors_; }

 private:
  void add(const at::Tensor& t) {
    if (is_fake(t) && seen_.insert(t.unsafeGetTensorImpl()).second) {
      tensors_.push_back(t);
    }
  }

  const MaterializeOptions& options_;
  std::vector<at::Tensor> tensors_;
  std::unordered_set<const c10::TensorImpl*> seen_;
};

}  // namespace

at::Tensor materialize_tensor(const at::Tensor& t, const MaterializeOptions& options) {
  detail::materialize_tensors_in_place({t}, options);
  return t;
}

void materialize_tensors(const std::vector<at::Tensor>& tensors,
                         const MaterializeOptions& options) {
  detail::materialize_tensors_in_place(tensors, options);
}

void materialize_module(torch::nn::Module& module, const MaterializeOptions& options) {
  ModuleTensors tensors(options);
  tensors.collect(module, /*is_root=*/true);
  detail::materialize_tensors_in_place(tensors.tensors(), options);
}

bool is_deferred(const torch::nn::Module& module) {
  for (const at::Tensor& p : module.parameters()) {
    if (is_fake(p)) {
      return true;
    }
  }
  for (const at::Tensor& b : module.buffers()) {
    if (is_fake(b)) {
      return true;
    }
  }
  return false;
}

}  // namespace torchdefer
