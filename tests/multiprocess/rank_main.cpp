// One rank of the multi-process sharding check (launched by multiprocess_test.cpp): records the
// model, materializes its own shard, all-gathers every rank's shards through a c10d FileStore,
// and checks that they concatenate to the full counter-mode materialization. Exits 0 on success.
//
//   torchdefer_rank STORE_PATH RANK WORLD DIM
#include <torchdefer/torchdefer.h>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include "bench/models/llama.h"

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

using torchdefer::models::Llama;
using torchdefer::models::LlamaConfig;

Llama record() {
  torch::manual_seed(31);  // every rank: the same program from the same seed
  return torchdefer::deferred_init([] { return Llama(LlamaConfig::named("tiny")); });
}

std::vector<uint8_t> bytes_of(const at::Tensor& t) {
  const at::Tensor contiguous = t.contiguous();
  const auto* data = static_cast<const uint8_t*>(contiguous.data_ptr());
  return std::vector<uint8_t>(data, data + contiguous.nbytes());
}

at::Tensor tensor_of(const std::vector<uint8_t>& bytes, c10::IntArrayRef sizes,
                     c10::ScalarType dtype) {
  at::Tensor t = torch::empty(sizes, dtype);
  TORCH_CHECK(static_cast<size_t>(t.nbytes()) == bytes.size(), "shard of the wrong size");
  std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: torchdefer_rank STORE_PATH RANK WORLD DIM\n";
    return 2;
  }
  const std::string path = argv[1];
  const int64_t rank = std::stoll(argv[2]);
  const int64_t world = std::stoll(argv[3]);
  const int64_t dim = std::stoll(argv[4]);
  auto store = c10::make_intrusive<c10d::FileStore>(path, static_cast<int>(world));

  Llama local = record();
  const torchdefer::Shard shard{rank, world, dim};
  torchdefer::materialize_module(*local, torchdefer::MaterializeOptions().shard(shard));
  for (const auto& p : local->named_parameters()) {
    store->set(p.key() + "/" + std::to_string(rank), bytes_of(p.value()));
  }

  Llama full = record();
  torchdefer::materialize_module(
      *full, torchdefer::MaterializeOptions().rng(torchdefer::RngMode::kCounter));
  int mismatches = 0;
  for (const auto& p : full->named_parameters()) {
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < world; ++r) {
      const std::optional<torchdefer::Box> box =
          torchdefer::Shard{r, world, dim}.box_for(p.value().sizes());
      const std::vector<int64_t> sizes = box ? box->sizes() : p.value().sizes().vec();
      parts.push_back(
          tensor_of(store->get(p.key() + "/" + std::to_string(r)), sizes, p.value().scalar_type()));
    }
    const at::Tensor gathered = p.value().dim() > dim ? torch::cat(parts, dim) : parts.front();
    if (!torch::equal(gathered, p.value())) {
      std::cerr << "rank " << rank << ": gathered " << p.key() << " differs from the full tensor\n";
      ++mismatches;
    }
  }
  // Leave only when every rank has read every shard: a FileStore lives in its file.
  store->set("finished/" + std::to_string(rank), std::vector<uint8_t>{1});
  std::vector<std::string> finished;
  for (int64_t r = 0; r < world; ++r) {
    finished.push_back("finished/" + std::to_string(r));
  }
  store->wait(finished);
  std::cout << "rank " << rank << " of " << world << " (dim " << dim
            << "): " << full->named_parameters().size() << " parameters gathered, " << mismatches
            << " mismatches\n";
  return mismatches == 0 ? 0 : 1;
}
