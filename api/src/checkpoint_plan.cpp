// Matching and checking a checkpoint against a module (checkpoint_plan.h).
#include "checkpoint_plan.h"

#include <torchdefer/fake_tensor.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/replay.h>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <utility>

namespace torchdefer::detail {
namespace {

// Note [Checking a checkpoint first]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every check runs before the first byte is read, over the whole module rather than only the
// tensors this call materializes, so that a call with check_fn, or on a parent after its
// children (Note [Nested materialization]), accepts the names of tensors it does not touch:
// - a checkpoint name that is no name of any parameter or buffer is an error when `strict`
//   (load_state_dict's "unexpected keys"), and is ignored otherwise;
// - a parameter or buffer the checkpoint lacks is initialized from the recording, strict or not:
//   initializing what the checkpoint lacks is what the call is for, so load_state_dict's
//   "missing keys" half of strict does not apply (stats report it with source "init");
// - a shape different from the recorded (global) shape, or a stored dtype that c10::canCast
//   refuses to cast to the recorded one (a float into an integer buffer), is an error whatever
//   `strict` says, as load_state_dict's size mismatch is;
// - a tensor to read that shares its storage with another tensor of the module (a view, or two
//   parameters made as slices of one) is refused: reading it into storage of its own would
//   untie them, which eager construction followed by load_state_dict does not.
// A tensor tied under several names (the same TensorImpl) is read once, from the first of its
// names the checkpoint holds. Errors list every offending name at once.
std::string shape_string(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

std::vector<int64_t> global_sizes(const at::Tensor& t) {
  if (const std::optional<ShardInfo> info = shard_info(t)) {
    return info->global_sizes;
  }
  return t.sizes().vec();
}

std::string join_lines(const std::vector<std::string>& lines) {
  constexpr size_t kShown = 20;
  std::ostringstream out;
  for (size_t i = 0; i < lines.size() && i < kShown; ++i) {
    out << "\n  " << lines[i];
  }
  if (lines.size() > kShown) {
    out << "\n  ... and " << lines.size() - kShown << " more";
  }
  return out.str();
}

}  // namespace

CheckpointPlan plan_checkpoint(const MaterializeOptions& options,
                               const std::vector<NamedTensor>& module_tensors,
                               const std::vector<NamedTensor>& entries) {
  const CheckpointReader& reader = *options.checkpoint();
  const std::string& prefix = options.checkpoint_prefix();
  std::map<std::string, const at::Tensor*> by_name;
  for (const NamedTensor& t : module_tensors) {
    by_name.emplace(t.name, &t.tensor);
  }
  for (const NamedTensor& t : entries) {
    by_name.emplace(t.name, &t.tensor);
  }
  std::vector<std::string> unexpected;
  std::vector<std::string> mismatched;
  std::unordered_map<const c10::TensorImpl*, std::string> key_of;
  for (const auto& [key, stored] : reader.tensors()) {
    if (key.compare(0, prefix.size(), prefix) != 0) {
      continue;  // another part of the model's
    }
    const auto it = by_name.find(key.substr(prefix.size()));
    if (it == by_name.end()) {
      unexpected.push_back(key);
      continue;
    }
    const at::Tensor& t = *it->second;
    const std::vector<int64_t> sizes = global_sizes(t);
    if (stored.sizes != sizes) {
      mismatched.push_back(key + ": the checkpoint's shape " + shape_string(stored.sizes) +
                           ", the module's " + shape_string(sizes));
    } else if (!c10::canCast(stored.dtype, t.scalar_type())) {
      mismatched.push_back(key + ": the checkpoint's dtype " + c10::toString(stored.dtype) +
                           " cannot be cast to the module's " + c10::toString(t.scalar_type()));
    }
    key_of.emplace(t.unsafeGetTensorImpl(), key);  // the first name of a tied tensor wins
  }
  TORCH_CHECK(!options.strict() || unexpected.empty(), "torchdefer: ", unexpected.size(),
              " tensor(s) of the checkpoint match no parameter or buffer of the module",
              prefix.empty() ? "" : " (after the prefix '" + prefix + "')",
              "; nothing was loaded:", join_lines(unexpected),
              "\nRename them (pass a mapping) or pass strict=False to ignore them.");
  TORCH_CHECK(mismatched.empty(), "torchdefer: ", mismatched.size(),
              " tensor(s) of the checkpoint do not fit the module; nothing was loaded:",
              join_lines(mismatched));

  // Every fake of the module by its storage identity, each TensorImpl once.
  std::map<const c10::StorageImpl*, std::vector<const NamedTensor*>> sharers;
  for (const NamedTensor& t : module_tensors) {
    if (const FakeTensorImpl* impl = fake_impl(t.tensor)) {
      auto& list = sharers[impl->storage_identity()];
      const bool listed = std::any_of(list.begin(), list.end(), [&](const NamedTensor* other) {
        return other->tensor.unsafeGetTensorImpl() == impl;
      });
      if (!listed) {
        list.push_back(&t);
      }
    }
  }
  std::vector<std::string> untied;
  for (const NamedTensor& entry : entries) {
    const auto it = key_of.find(entry.tensor.unsafeGetTensorImpl());
    const FakeTensorImpl* impl = fake_impl(entry.tensor);
    if (it == key_of.end() || impl == nullptr) {
      continue;
    }
    for (const NamedTensor* other : sharers[impl->storage_identity()]) {
      if (other->tensor.unsafeGetTensorImpl() != impl) {
        untied.push_back(it->second + " shares its storage with " + other->name);
        break;
      }
    }
  }
  TORCH_CHECK(untied.empty(), "torchdefer: ", untied.size(),
              " tensor(s) of the checkpoint are views of a storage other tensors of the module "
              "share; reading them would untie them, so nothing was loaded:",
              join_lines(untied),
              "\nMaterialize without the checkpoint and load_state_dict() into the module.");
  return CheckpointPlan{std::move(key_of)};
}

}  // namespace torchdefer::detail
