// The public materialization API: tensors and torch::nn modules.
#include <torchdefer/counter_rng.h>
#include <torchdefer/deferred_init.h>
#include <torchdefer/extension.h>
#include <torchdefer/fake_tensor.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/materialize.h>
#include <torchdefer/torch_compat.h>

#include <c10/core/GradMode.h>
#include <c10/util/StringUtil.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "checkpoint_plan.h"
#include "materialization.h"

namespace torchdefer {
namespace {

// Note [Real tensors of a sharded module]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A module built under deferred_init can hold tensors that were real at record time: a
// parameter made by `torch.tensor([0.5, 2.0])`, or from values read while recording. Sharding
// promises every parameter as this rank's chunk, so a sharded materialization slices those too,
// in place (set_data: the same tensor, and in Python the same Parameter, holds the chunk), and
// reports them with the fallback "real at record time"; so is a fake that construction itself
// turned real (`p.data = torch.tensor(...)`, then writes through its views: an
// nn.MultiheadAttention's in_proj_weight). A tensor that an earlier materialization turned real
// (FakeTensorImpl::materialized()) or that already is a shard is
// left alone (Note [Nested materialization]), and so is a tensor subclass (a DTensor is sharded
// by its own placements). Fakes of the same call that read such a tensor are computed before it
// is sliced. A recording materialized later that reads it would get the slice instead of what
// construction read, so slicing bumps the tensor's version: that replay stops with the message
// for a real input modified since recording instead of computing something else.
bool real_at_record_time(const at::Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided || is_fake(t)) {
    return false;
  }
  const auto* turned_real = dynamic_cast<const FakeTensorImpl*>(t.unsafeGetTensorImpl());
  return (turned_real == nullptr || !turned_real->materialized()) &&
         !t.unsafeGetTensorImpl()->is_python_dispatch() && !shard_info(t);
}

constexpr const char* kRealAtRecordTime = "real at record time";

// The fake parameters and buffers materialize_module reaches, each TensorImpl once; for a
// sharded call or one with a checkpoint also the real ones (Note [Real tensors of a sharded
// module], Note [Loading a tensor real at record time]).
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
  void collect(const torch::nn::Module& module, const std::string& prefix, bool is_root) {
    if (!is_root && options_.check_fn() && !options_.check_fn()(module)) {
      return;
    }
    for (const auto& child : module.named_children()) {
      collect(*child.value(), prefix + child.key() + ".", /*is_root=*/false);
    }
    if (!options_.buffers_only()) {
      for (const auto& p : module.named_parameters(/*recurse=*/false)) {
        add(prefix + p.key(), p.value(), /*parameter=*/true);
      }
    }
    for (const auto& b : module.named_buffers(/*recurse=*/false)) {
      add(prefix + b.key(), b.value(), /*parameter=*/false);
    }
  }

  const std::vector<NamedTensor>& entries() const { return entries_; }

 private:
  void add(std::string name, const at::Tensor& t, bool parameter) {
    const bool wanted =
        is_fake(t) || ((options_.sharded() || options_.checkpoint()) && real_at_record_time(t));
    if (wanted && seen_.insert(t.unsafeGetTensorImpl()).second) {
      entries_.push_back({std::move(name), t, parameter});
    }
  }

  const MaterializeOptions& options_;
  std::vector<NamedTensor> entries_;
  std::unordered_set<const c10::TensorImpl*> seen_;
};

// The box `entry` gets under the options' layout, or nullopt when it stays whole.
std::optional<Box> box_of(const NamedTensor& entry, const MaterializeOptions& options) {
  const c10::IntArrayRef sizes = entry.tensor.sizes();
  std::optional<Box> box;
  if (options.region()) {
    box = options.region()(entry.name, sizes);
  } else if (entry.parameter) {
    box = options.shard()->box_for(sizes);
  }
  if (box) {
    TORCH_CHECK(box->start.size() == sizes.size() && box->stop.size() == sizes.size(),
                "torchdefer: the region for '", entry.name, "' has ", box->start.size(),
                " dimensions, but the tensor is ", describe(entry.tensor));
    for (size_t d = 0; d < sizes.size(); ++d) {
      TORCH_CHECK(0 <= box->start[d] && box->start[d] <= box->stop[d] && box->stop[d] <= sizes[d],
                  "torchdefer: the region for '", entry.name, "' along dimension ", d, " is [",
                  box->start[d], ", ", box->stop[d], "), outside the tensor ",
                  describe(entry.tensor), ". A region must lie within [0, size).");
    }
    // Note [A region may be the whole tensor]
    // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    // A shard layout that gives a rank the whole tensor means "replicate": full replay, shared
    // storages kept. A region function that names the whole box explicitly asks for region replay
    // instead: the tensor may itself be a slice of a larger recorded one (FSDP2's padded shard
    // buffer is new_zeros + copy_ of one chunk of the parameter), and only region replay computes
    // it without computing the rest of that parameter.
    if (!options.region() && *box == whole(sizes)) {
      box.reset();
    }
  }
  return box;
}

// Plans the slice of a tensor that was real at record time (Note [Real tensors of a sharded
// module]): its box, copied so that the rest of it can be freed, on the requested device. A
// parameter it keeps whole is still reported; a buffer it keeps whole is not, as before.
void plan_real(const NamedTensor& entry, const MaterializeOptions& options, MaterializeStats& stats,
               detail::Materialization& materialization) {
  TensorStats tensor_stats;
  tensor_stats.name = entry.name;
  tensor_stats.global_sizes = entry.tensor.sizes().vec();
  tensor_stats.fallback = kRealAtRecordTime;
  const std::optional<Box> box = box_of(entry, options);
  if (!box) {
    if (entry.parameter) {
      tensor_stats.bytes_kept = static_cast<int64_t>(entry.tensor.nbytes());
      stats.tensors.push_back(std::move(tensor_stats));
    }
    return;
  }
  tensor_stats.box = box;
  const at::Tensor& local = materialization.add_real_shard(entry, *box);
  tensor_stats.bytes_kept = static_cast<int64_t>(local.nbytes());
  tensor_stats.bytes_computed = local.is_alias_of(entry.tensor) ? 0 : tensor_stats.bytes_kept;
  stats.tensors.push_back(std::move(tensor_stats));
}

// Reads `entry` (its box when `box`) from the checkpoint under `key`, and reports it.
void plan_loaded(const NamedTensor& entry, const std::optional<Box>& box, const std::string& key,
                 TensorStats& stats, detail::Materialization& materialization) {
  stats.source = "checkpoint";
  stats.box = box;
  stats.bytes_kept = materialization.add_loaded(entry, box, key);
}

// Reads `entry`, real at record time, from the checkpoint under `key` (its box when `box`),
// to take the values at commit (Note [Loading a tensor real at record time]); its stats.
TensorStats plan_loaded_real(const NamedTensor& entry, const std::optional<Box>& box,
                             const std::string& key, detail::Materialization& materialization) {
  TensorStats stats;
  stats.name = entry.name;
  stats.global_sizes = entry.tensor.sizes().vec();
  plan_loaded(entry, box, key, stats, materialization);
  return stats;
}

MaterializeStats materialize_sharded(const std::vector<NamedTensor>& tensors,
                                     const MaterializeOptions& options,
                                     const detail::CheckpointPlan& checkpoint) {
  MaterializeStats stats;
  detail::Materialization materialization(options);
  std::vector<std::string> names_done_by_run;  // read or replayed whole by run(): reported after it
  const auto fakes = std::count_if(tensors.begin(), tensors.end(),
                                   [](const NamedTensor& entry) { return is_fake(entry.tensor); });
  detail::ProgressReporter progress(options, fakes);
  for (const NamedTensor& entry : tensors) {
    if (real_at_record_time(entry.tensor)) {
      if (const std::string* key = checkpoint.key(entry.tensor)) {
        stats.tensors.push_back(
            plan_loaded_real(entry, box_of(entry, options), *key, materialization));
      } else {
        plan_real(entry, options, stats, materialization);
      }
      continue;
    }
    if (!is_fake(entry.tensor)) {
      continue;
    }
    TensorStats tensor_stats;
    tensor_stats.name = entry.name;
    tensor_stats.global_sizes = entry.tensor.sizes().vec();
    const std::optional<Box> box = box_of(entry, options);
    if (const std::string* key = checkpoint.key(entry.tensor)) {
      plan_loaded(entry, box, *key, tensor_stats, materialization);
      stats.tensors.push_back(std::move(tensor_stats));
      names_done_by_run.push_back(entry.name);
      continue;
    }
    if (!box) {
      tensor_stats.bytes_computed = tensor_stats.bytes_kept =
          static_cast<int64_t>(entry.tensor.nbytes());
      materialization.add(entry.tensor);
      names_done_by_run.push_back(entry.name);
      stats.tensors.push_back(std::move(tensor_stats));
      continue;
    }
    tensor_stats.box = box;
    const at::Tensor& local = materialization.add_shard(entry, *box, tensor_stats);
    tensor_stats.bytes_kept = static_cast<int64_t>(local.nbytes());
    stats.tensors.push_back(std::move(tensor_stats));
    progress.step(entry.name);
  }
  materialization.run(/*report_progress=*/false);
  for (const std::string& name : names_done_by_run) {
    progress.step(name);
  }
  return stats;
}

// Materializes `tensors` whole in one Materialization (Note [One materialization]).
void materialize_whole(const std::vector<at::Tensor>& tensors, const MaterializeOptions& options) {
  detail::Materialization materialization(options);
  for (const at::Tensor& t : tensors) {
    materialization.add(t);
  }
  materialization.run(/*report_progress=*/true);
}

// The checkpoint's plan for a call, checked (Note [Checking a checkpoint first]); empty
// without a checkpoint. A tensor real at record time is read when it is among the call's
// tensors (Note [Loading a tensor real at record time]); one the checkpoint holds that the call
// was not given (a caller that passes only fakes, a subtree check_fn skips) is refused by name
// rather than left with construction's values.
detail::CheckpointPlan checkpoint_plan(const std::vector<NamedTensor>& tensors,
                                       const std::vector<NamedTensor>& module_tensors,
                                       const MaterializeOptions& options) {
  if (!options.checkpoint()) {
    return {};
  }
  detail::CheckpointPlan plan = detail::plan_checkpoint(options, module_tensors, tensors);
  std::unordered_set<const c10::TensorImpl*> given;
  for (const NamedTensor& t : tensors) {
    given.insert(t.tensor.unsafeGetTensorImpl());
  }
  std::vector<std::string> real;
  for (const NamedTensor& t : module_tensors) {
    const std::string* key = plan.key(t.tensor);
    if (real_at_record_time(t.tensor) && key != nullptr &&
        !(options.buffers_only() && t.parameter) &&
        given.count(t.tensor.unsafeGetTensorImpl()) == 0 &&
        std::find(real.begin(), real.end(), *key) == real.end()) {
      real.push_back(*key);  // once, though the module lists a tensor under each of its names
    }
  }
  TORCH_CHECK(real.empty(), "torchdefer: the checkpoint holds ", c10::Join(", ", real),
              ", which construction made real (not a recorded fake) and which this call does "
              "not materialize, so it cannot be loaded; nothing was loaded. Materialize it in "
              "this call (it is loaded when among the call's tensors) or leave it out of the "
              "checkpoint (pass a mapping without it).");
  return plan;
}

}  // namespace

at::Tensor materialize_tensor(const at::Tensor& t, const MaterializeOptions& options) {
  materialize_whole({t}, options);
  return t;
}

void materialize_tensors(const std::vector<at::Tensor>& tensors,
                         const MaterializeOptions& options) {
  materialize_whole(tensors, options);
}

namespace {

// Plans and runs one materialization of `tensors` (a module's, or a caller's list); stats are
// completed by materialize_named_tensors.
MaterializeStats materialize_entries(const std::vector<NamedTensor>& tensors,
                                     const std::vector<NamedTensor>& module_tensors,
                                     const MaterializeOptions& options) {
  for (const NamedTensor& entry : tensors) {
    if (made_in_inference_mode(entry.tensor)) {  // Note [Inference mode while recording]
      refuse_inference_tensor("cannot materialize " + entry.name + ": it");
    }
  }
  const detail::CheckpointPlan checkpoint = checkpoint_plan(tensors, module_tensors, options);
  if (options.sharded()) {
    return materialize_sharded(tensors, options, checkpoint);
  }
  MaterializeStats stats;
  detail::Materialization materialization(options);
  for (const NamedTensor& entry : tensors) {
    if (!is_fake(entry.tensor)) {
      const std::string* key = checkpoint.key(entry.tensor);
      if (key != nullptr && real_at_record_time(entry.tensor)) {
        stats.tensors.push_back(plan_loaded_real(entry, std::nullopt, *key, materialization));
      }
      continue;
    }
    const auto bytes = static_cast<int64_t>(entry.tensor.nbytes());
    TensorStats tensor_stats{entry.name, entry.tensor.sizes().vec(), std::nullopt, false, "", bytes,
                             bytes};
    if (const std::string* key = checkpoint.key(entry.tensor)) {
      tensor_stats.bytes_computed = 0;
      plan_loaded(entry, std::nullopt, *key, tensor_stats, materialization);
    } else {
      materialization.add(entry.tensor);
    }
    stats.tensors.push_back(std::move(tensor_stats));
  }
  materialization.run(/*report_progress=*/true);
  return stats;
}

}  // namespace

MaterializeStats materialize_named_tensors(const std::vector<NamedTensor>& tensors,
                                           const std::vector<NamedTensor>& module_tensors,
                                           const MaterializeOptions& options) {
  MaterializeStats stats = materialize_entries(tensors, module_tensors, options);
  if (options.rng() == RngMode::kCounter) {
    for (TensorStats& t : stats.tensors) {
      if (t.source == "init" && t.fallback != kRealAtRecordTime) {
        t.counter_scheme = kCounterSchemeVersion;
      }
    }
  }
  return stats;
}

MaterializeStats materialize_named_tensors(const std::vector<NamedTensor>& tensors,
                                           const MaterializeOptions& options) {
  return materialize_named_tensors(tensors, tensors, options);
}

MaterializeStats materialize_module(torch::nn::Module& module, const MaterializeOptions& options) {
  ModuleTensors tensors(options);
  tensors.collect(module, "", /*is_root=*/true);
  std::vector<NamedTensor> module_tensors;
  if (options.checkpoint()) {
    for (const auto& p : module.named_parameters(/*recurse=*/true)) {
      module_tensors.push_back({p.key(), p.value(), true});
    }
    for (const auto& b : module.named_buffers(/*recurse=*/true)) {
      module_tensors.push_back({b.key(), b.value(), false});
    }
  }
  return materialize_named_tensors(tensors.entries(), module_tensors, options);
}

std::string MaterializeStats::to_string() const {
  std::ostringstream out;
  int64_t computed = 0;
  int64_t kept = 0;
  int64_t sliced = 0;
  int64_t fell_back = 0;
  int64_t read = 0;
  for (const TensorStats& t : tensors) {
    out << t.name << " " << c10::IntArrayRef(t.global_sizes);
    if (t.box) {
      out << " box " << c10::IntArrayRef(t.box->start) << " to " << c10::IntArrayRef(t.box->stop);
    } else {
      out << " whole";
    }
    if (t.source == "checkpoint") {
      out << ", read from the checkpoint";
      ++read;
    } else if (t.box && !t.sliced) {
      out << " whole then sliced (" << t.fallback << ")";
      ++fell_back;
    } else if (t.box && !t.fallback.empty()) {
      out << " sliced, inputs computed whole (" << t.fallback << ")";
      ++sliced;
    } else if (t.box) {
      out << " sliced";
      ++sliced;
    }
    out << ", computed " << t.bytes_computed << " B, kept " << t.bytes_kept << " B\n";
    computed += t.bytes_computed;
    kept += t.bytes_kept;
  }
  out << tensors.size() << " tensors: " << sliced << " sliced, " << fell_back
      << " computed whole then sliced";
  if (read > 0) {
    out << ", " << read << " read from the checkpoint";
  }
  out << "; " << computed << " B computed, " << kept << " B kept";
  return out.str();
}

bool can_materialize(const at::Tensor& t) { return recorded(t) != nullptr; }

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
