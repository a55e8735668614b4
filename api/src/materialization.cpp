// The orchestrator of every materialization call (Note [One materialization]).
#include "materialization.h"

#include <torchdefer/fake_tensor.h>
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/rng_anchors.h>
#include <torchdefer/torch_compat.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <set>
#include <utility>

#include <torchdefer/region_replay.h>

namespace torchdefer::detail {
namespace {

const RecordedFake& recording_of(const at::Tensor& fake) {
  const RecordedFake* rec = recorded(fake);
  TORCH_CHECK(rec != nullptr, "torchdefer: cannot materialize ", describe(fake),
              ": it was made under a FakeMode, which records nothing. Create it under "
              "torchdefer::deferred_init to be able to materialize it.");
  return *rec;
}

// The sizes of a shard of `box` as kept: padded to the chunk size when the options ask.
std::vector<int64_t> kept_sizes(const Box& box, const MaterializeOptions& options,
                                const NamedTensor& entry) {
  std::vector<int64_t> sizes = box.sizes();
  if (options.shard() && options.shard()->padded && !options.region()) {
    const Shard& shard = *options.shard();
    sizes[shard.dim] = shard.chunk_size(entry.tensor.size(shard.dim));
  }
  return sizes;
}

// A shard that owns exactly its elements, padded to the chunk size when the options ask.
at::Tensor own(at::Tensor local, const Box& box, const MaterializeOptions& options,
               const NamedTensor& entry) {
  if (!local.is_contiguous() || local.storage().nbytes() != local.nbytes()) {
    local = local.clone(at::MemoryFormat::Contiguous);
  }
  const std::vector<int64_t> sizes = kept_sizes(box, options, entry);
  if (local.sizes() == c10::IntArrayRef(sizes)) {
    return local;
  }
  const int64_t dim = options.shard()->dim;
  at::Tensor padded = at::zeros(sizes, local.options());
  padded.narrow(dim, 0, local.size(dim)).copy_(local);
  return padded;
}

}  // namespace

ReplayConfig replay_config(const MaterializeOptions& options) {
  ReplayConfig config;
  config.device = options.device();
  config.counter_rng = options.rng() == RngMode::kCounter;
  config.counter_seed = options.counter_seed();
  return config;
}

Materialization::Materialization(const MaterializeOptions& options)
    : options_(options), config_(replay_config(options)) {}

Materialization::Group& Materialization::group_of(const std::shared_ptr<OpGraph>& graph) {
  Group& group = groups_[graph.get()];
  if (!group.graph) {
    group.graph = graph;
  }
  return group;
}

void Materialization::add(const at::Tensor& t) {
  if (!is_fake(t)) {
    return;
  }
  add_target(t);
  // A view's base is reachable from it (`t._base`) and holds its storage: a whole materialization
  // turns it real with it, at no cost beyond the view's own replay, so that no fake of the
  // recording is left behind a model whose tensors are all real (Note [Samplers nothing keeps]).
  // Not a sharded one: the base may be a parameter that the same call makes this rank's shard
  // (`register_buffer("row", linear.weight[0])`).
  if (!options_.sharded() && t.is_view() && is_fake(t._base())) {
    add_target(at::Tensor(t._base()));
  }
}

void Materialization::add_target(const at::Tensor& fake) {
  Group& group = group_of(recording_of(fake).shared_graph());
  if (group.seen.insert(fake.unsafeGetTensorImpl()).second) {
    group.targets.push_back(fake);
    group.replay.reset();  // planned again with this target
  }
}

// Plans every group that has no plan yet; a foreign fake a plan reads becomes a target of its own
// recording's group, which then needs a (new) plan. Targets only grow, so this ends.
void Materialization::plan() {
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& [key, group] : groups_) {
      if (group.replay) {
        continue;
      }
      changed = true;
      auto replay = std::make_unique<GraphReplay>(group.graph, config_);
      for (const at::Tensor& target : group.targets) {
        replay->add_target(target);
      }
      {
        const auto lock = group.graph->lock();
        replay->plan();
      }
      group.reads.clear();
      const std::vector<at::Tensor> foreign = replay->foreign_fakes();
      group.replay = std::move(replay);
      for (const at::Tensor& fake : foreign) {
        group.reads.push_back(recording_of(fake).graph);
        add_target(fake);  // may rehash nothing: groups_ is a std::map
      }
      break;  // groups_ may have grown; start over
    }
  }
}

// The groups, each after the groups whose fakes it reads.
std::vector<Materialization::Group*> Materialization::run_order() {
  std::vector<Group*> order;
  std::map<const OpGraph*, int> state;  // 1: being visited, 2: done
  std::function<void(const OpGraph*)> visit = [&](const OpGraph* key) {
    int& s = state[key];
    if (s == 2) {
      return;
    }
    Group& group = groups_.at(key);
    TORCH_CHECK(s != 1, "torchdefer: cannot materialize: the recording of ", group.graph->context(),
                " reads fakes whose own recordings read its fakes in turn, so none of them can be "
                "replayed first. Materialize the fakes of one recording before another recording "
                "reads them.");
    s = 1;
    for (const OpGraph* read : group.reads) {
      visit(read);
    }
    state[key] = 2;
    order.push_back(&group);
  };
  for (auto& [key, group] : groups_) {
    visit(key);
  }
  return order;
}

// One sharded tensor's local values, by region replay or, failing that, whole and sliced.
at::Tensor Materialization::compute_shard(const NamedTensor& entry, const Box& box,
                                          TensorStats& stats) {
  const RecordedFake& rec = recording_of(entry.tensor);
  std::shared_ptr<OpGraph> graph = rec.shared_graph();
  const auto lock = graph->lock();
  RealOnlyGuard real_only;
  c10::AutoGradMode no_grad(false);
  RegionReplay region(graph, config_);
  if (std::optional<at::Tensor> local = region.local(rec.value, box)) {
    stats.sliced = true;
    stats.fallback = c10::Join(", ", region.whole_inputs());
    stats.bytes_computed = region.bytes_computed();
    return own(*local, box, options_, entry);
  }
  stats.fallback = region.why();
  GraphReplay whole_tensor(graph, config_);
  whole_tensor.add_target(entry.tensor);
  whole_tensor.plan();
  whole_tensor.run();
  const at::Tensor& full = whole_tensor.result(0);
  stats.bytes_computed = static_cast<int64_t>(full.nbytes());
  return own(slice(full, box), box, options_, entry);
}

const at::Tensor& Materialization::add_shard(const NamedTensor& entry, const Box& box,
                                             TensorStats& stats) {
  at::Tensor local = compute_shard(entry, box, stats);
  ShardInfo info{entry.tensor.sizes().vec(), box, local.sizes().vec() != box.sizes()};
  shards_.push_back({entry.tensor, std::move(local), std::move(info)});
  return shards_.back().local;
}

void Materialization::run(bool report_progress) {
  read_checkpoint();
  plan();
  const std::vector<Group*> order = run_order();
  int64_t total = 0;
  for (const Group* group : order) {
    total += group->replay->planned_nodes();
  }
  ProgressReporter progress(options_, total);
  std::function<void(const std::string&)> on_node;
  if (report_progress) {
    on_node = [&progress](const std::string& op) { progress.step(op); };
  }
  ForeignValues computed;
  for (Group* group : order) {
    group->replay->run(computed, on_node);
    for (size_t i = 0; i < group->targets.size(); ++i) {
      computed.emplace(group->targets[i].unsafeGetTensorImpl(), group->replay->result(i));
    }
  }
  commit();
  if (!config_.counter_rng) {
    pay_for_finished_recordings();
  }
}

// Note [Samplers nothing keeps] (recorder/src/rng_anchors.cpp): a torch-mode materialization
// after which nothing holds a recording it replayed (every fake of it is real now, or gone) pays
// what that recording owes the default generator. The groups and their replays hold their
// recordings: they are let go first.
void Materialization::pay_for_finished_recordings() {
  std::vector<std::weak_ptr<OpGraph>> replayed;
  for (const auto& [key, group] : groups_) {
    replayed.push_back(group.graph);
  }
  groups_.clear();
  detail::pay_generator_debt_of_finished(replayed);
}

void Materialization::commit() noexcept {
  for (auto& [key, group] : groups_) {
    group.replay->commit();
  }
  for (const LocalShard& loaded : loaded_whole_) {
    fake_impl(loaded.fake)->materialize(loaded.local.getIntrusivePtr());
  }
  for (const LocalShard& loaded : loaded_real_) {
    // Note [Loading a tensor real at record time]: in place, as load_state_dict copies.
    const c10::InferenceMode inference(loaded.fake.is_inference());
    const at::NoGradGuard no_grad;
    loaded.fake.detach().copy_(loaded.local);
  }
  for (const LocalShard& shard : shards_) {
    fake_impl(shard.fake)->materialize(shard.local.getIntrusivePtr());
    set_shard_info(shard.fake, shard.info);
  }
  // Note [Real tensors of a sharded module]: the same tensor holds its slice from now on, and a
  // recording that read the whole of it sees a new version.
  for (LocalShard& real : real_shards_) {
    const bool same_storage = real.local.is_alias_of(real.fake);
    real.fake.set_data(real.local);
    set_shard_info(real.fake, real.info);
    if (!same_storage && !real.fake.is_inference()) {
      real.fake.unsafeGetTensorImpl()->bump_version();
    }
  }
}

const at::Tensor& Materialization::add_real_shard(const NamedTensor& entry, const Box& box) {
  at::Tensor local = slice(entry.tensor.detach(), box);
  if (options_.device()) {
    local = local.to(*options_.device());
  }
  local = own(local, box, options_, entry);
  ShardInfo info{entry.tensor.sizes().vec(), box, local.sizes().vec() != box.sizes()};
  real_shards_.push_back({entry.tensor, std::move(local), std::move(info)});
  return real_shards_.back().local;
}

// Note [Loading is committed with the rest]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tensor read from a checkpoint is read into a tensor of its own (allocated when added, read
// with the call's others: Note [One read for every tensor of a call]), and takes it over at
// commit like a computed shard, so a failed read or replay anywhere leaves every tensor
// fake. It is not a replay target: its recording never runs for it, and the recording is not
// told its storage turned real, so another fake of the recording that reads it still computes
// the values construction gave it (what eager construction followed by load_state_dict leaves
// in a buffer derived from a parameter). A whole tensor keeps the strides the recording gave it.
//
// Note [Loading a tensor real at record time]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A parameter or buffer that construction made real (`torch.tensor(2.5)`, Note [Real tensors of
// a sharded module]) and that the checkpoint holds is read like a fake, into a tensor of its own,
// and takes the values only at commit, after every replay has run: a fake of the call computed
// from it gets the value construction gave it (as eager construction followed by
// load_state_dict leaves a buffer derived from a parameter), and a failed read or replay leaves
// it untouched. Kept whole, it is copied into in place at commit, as load_state_dict does: the
// same tensor, its storage and every view of it keep being one (so no tie breaks) and its
// version counter moves on. As this rank's box, it is swapped for the box read, as a sharded call
// swaps it for its slice. Until commit the process holds the tensor and its read copy.
int64_t Materialization::add_loaded(const NamedTensor& entry, const std::optional<Box>& box,
                                    const std::string& key) {
  const at::Tensor& fake = entry.tensor;
  const bool real = !is_fake(fake);
  const c10::Device device =
      real && !box ? fake.device() : options_.device().value_or(fake.device());
  const auto tensor_options = at::TensorOptions().dtype(fake.scalar_type()).device(device);
  const Box region = box.value_or(whole(fake.sizes()));
  reads_.push_back({key, region, at::empty(region.sizes(), tensor_options)});
  loads_.push_back({entry, box, real});
  const std::vector<int64_t> kept = box ? kept_sizes(*box, options_, entry) : fake.sizes().vec();
  return c10::multiply_integers(kept) * static_cast<int64_t>(fake.element_size());
}

// Note [One read for every tensor of a call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every tensor a call loads is allocated when added and read in one CheckpointReader::read_all
// before any replay runs, so that a reader which gains from seeing the whole batch can (DCP
// plans one load for all of them, and reads each stored file once). Reading first also makes a
// bad file fail before the replays spend their time.
void Materialization::read_checkpoint() {
  if (reads_.empty()) {
    return;
  }
  options_.checkpoint()->read_all(reads_);
  for (size_t i = 0; i < loads_.size(); ++i) {
    const at::Tensor& fake = loads_[i].entry.tensor;
    at::Tensor local = std::move(reads_[i].out);
    if (const std::optional<Box>& box = loads_[i].box) {
      local = own(local, *box, options_, loads_[i].entry);
      ShardInfo info{fake.sizes().vec(), *box, local.sizes().vec() != box->sizes()};
      (loads_[i].real ? real_shards_ : shards_)
          .push_back({fake, std::move(local), std::move(info)});
      continue;
    }
    if (loads_[i].real) {
      loaded_real_.push_back({fake, std::move(local), ShardInfo{}});
      continue;
    }
    if (!fake.is_contiguous() && fake.is_non_overlapping_and_dense()) {
      at::Tensor strided = at::empty_strided(fake.sizes(), fake.strides(), local.options());
      strided.copy_(local);
      local = std::move(strided);
    }
    loaded_whole_.push_back({fake, std::move(local), ShardInfo{}});
  }
  reads_.clear();
  loads_.clear();
}

at::Tensor read_recorded_values(const at::Tensor& fake) {
  const RecordedFake& rec = recording_of(fake);
  ReplayConfig config;
  config.device = c10::Device(c10::kCPU);
  GraphReplay replay(rec.shared_graph(), config);
  replay.add_value(rec.value);
  {
    const auto lock = rec.graph->lock();
    replay.plan();
  }
  const std::vector<at::Tensor> foreign = replay.foreign_fakes();
  TORCH_CHECK(foreign.empty(), "torchdefer: cannot read the values of ", describe(fake),
              ": they are computed from ", describe(foreign.front()),
              ", a fake of another deferred_init, and reading values must not materialize it. "
              "Materialize that tensor first.");
  replay.run();
  // The result may view a storage that was already real (materialized during construction).
  RealOnlyGuard real_only;
  return replay.result(0).clone();
}

}  // namespace torchdefer::detail
