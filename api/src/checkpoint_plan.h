// Which checkpoint tensor each tensor of a materialization is read from, decided and checked
// against the whole module before anything is read (Note [Checking a checkpoint first]).
#pragma once

#include <torchdefer/extension.h>
#include <torchdefer/materialize.h>

#include <c10/core/TensorImpl.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace torchdefer::detail {

struct CheckpointPlan {
  // The checkpoint name of each tensor of the module the checkpoint holds.
  std::unordered_map<const c10::TensorImpl*, std::string> key_of;

  const std::string* key(const at::Tensor& t) const {
    const auto it = key_of.find(t.unsafeGetTensorImpl());
    return it == key_of.end() ? nullptr : &it->second;
  }
};

// Matches the checkpoint of `options` to `entries` (the tensors to materialize) by the names in
// `module_tensors` (every parameter and buffer of the module under every name it has, real and
// skipped ones included). Throws c10::Error naming every offending key when a name matches no
// tensor (strict only), a shape differs from the recorded one, a dtype cannot be cast, or a
// tensor read from the checkpoint shares its storage with another tensor of the module.
CheckpointPlan plan_checkpoint(const MaterializeOptions& options,
                               const std::vector<NamedTensor>& module_tensors,
                               const std::vector<NamedTensor>& entries);

}  // namespace torchdefer::detail
