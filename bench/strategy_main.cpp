// One initialization strategy for the C++ Llama, measured in a process of its own (peak RSS is
// per process), for the benchmark harness (bench/harness/run.py). Prints one JSON line.
//
//   torchdefer_bench_strategy --strategy eager|deferred-full|deferred-shard --model NAME
//                             [--rank R --world W] [--seed S]
//
//   eager           construct on the CPU; with --world above 1, keep only rank R's slice after
//   deferred-full   deferred_init, then materialize_module (torch RNG mode: eager's values)
//   deferred-shard  deferred_init, then materialize rank R of W (counter RNG, dim 0)
#include <torchdefer/torchdefer.h>

#include <ATen/Parallel.h>

#include "bench/models/llama.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

namespace {

using torchdefer::models::Llama;
using torchdefer::models::LlamaConfig;

struct Options {
  std::string strategy;
  std::string model;
  int64_t rank = 0;
  int64_t world = 1;
  uint64_t seed = 0;
};

// Note [Record phase on its own]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Recording is meant to cost what building the model on the meta device costs, so every run
// reports its construction phase (for deferred_init: the recording) next to a construction of
// the same model on the meta device (here under a FakeMode, the C++ frontend's equivalent), in
// the same process just before it: both see the same load, which on a shared machine moves
// absolute times more than ratios. Each phase gets its own peak resident growth: the process's
// VmHWM is reset to the current resident size when the phase starts (/proc/self/clear_refs), so
// an earlier, larger peak cannot hide it. bench/harness/strategy.py does the same for Python.

// What one run measured; the harness reads these fields by name.
struct Measurement {
  double construct_s = 0;
  double materialize_s = 0;
  // Note [Record phase on its own]; -1 where the kernel does not let the peak be reset.
  int64_t construct_rss_bytes = -1;
  double meta_construct_s = 0;
  int64_t meta_rss_bytes = -1;
  int64_t bytes_kept = 0;
  int64_t bytes_computed = 0;
  int64_t tensors_sliced = 0;
  int64_t tensors_fallback = 0;
  int64_t tensors_whole = 0;
  int64_t elements_sliced = 0;
  int64_t elements_fallback = 0;
  std::map<std::string, int64_t> fallback_ops;
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "torchdefer_bench_strategy: " << problem << "\n"
            << "usage: torchdefer_bench_strategy --strategy eager|deferred-full|deferred-shard\n"
            << "                                 --model NAME [--rank R --world W] [--seed S]\n";
  std::exit(2);
}

int64_t non_negative(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const int64_t n = std::stoll(value, &used);
    if (used == value.size() && n >= 0) {
      return n;
    }
  } catch (const std::exception&) {
  }
  usage(flag + " needs a non-negative integer, got '" + value + "'");
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      usage(flag + " needs a value");
    }
    const std::string value = argv[i + 1];
    if (flag == "--strategy") {
      options.strategy = value;
    } else if (flag == "--model") {
      options.model = value;
    } else if (flag == "--rank") {
      options.rank = non_negative(flag, value);
    } else if (flag == "--world") {
      options.world = non_negative(flag, value);
    } else if (flag == "--seed") {
      options.seed = static_cast<uint64_t>(non_negative(flag, value));
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (options.strategy != "eager" && options.strategy != "deferred-full" &&
      options.strategy != "deferred-shard") {
    usage("--strategy must be eager, deferred-full or deferred-shard, got '" + options.strategy +
          "'");
  }
  if (options.model.empty()) {
    usage("--model is required");
  }
  if (options.world < 1 || options.rank >= options.world) {
    usage("--rank must be below --world, and --world at least 1");
  }
  return options;
}

// A field of /proc/self/status in bytes: VmHWM is the peak resident set, VmRSS the current one.
int64_t proc_status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream fields(line.substr(field.size() + 1));
      int64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  throw std::runtime_error("/proc/self/status has no " + field);
}

// The peak resident growth of one phase: VmHWM is reset to the current resident size when the
// phase starts (writing 5 to /proc/self/clear_refs), so VmHWM after it is the phase's own peak,
// or the resident size at its start if that is larger: a reset VmHWM can read below it (Note [A
// reset VmHWM can read below the start] in bench/harness/strategy.py).
class PhasePeak {
 public:
  PhasePeak() {
    std::ofstream clear_refs("/proc/self/clear_refs");
    clear_refs << "5";
    clear_refs.flush();
    reset_ = static_cast<bool>(clear_refs);
    start_rss_ = proc_status_bytes("VmRSS");
  }
  int64_t peak() const { return std::max(proc_status_bytes("VmHWM"), start_rss_); }
  int64_t growth() const { return reset_ ? peak() - start_rss_ : -1; }

 private:
  bool reset_ = false;
  int64_t start_rss_ = 0;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t tensor_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const at::Tensor& t : module.parameters()) {
    bytes += static_cast<int64_t>(t.nbytes());
  }
  for (const at::Tensor& t : module.buffers()) {
    bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

// Eager construction; with a world above 1, each parameter is then cut down to this rank's slice
// (what a rank without deferred init does before handing the model to FSDP).
Measurement run_eager(const LlamaConfig& config, const Options& options) {
  Measurement m;
  const PhasePeak peak;
  auto start = std::chrono::steady_clock::now();
  Llama model(config);
  m.construct_s = seconds_since(start);
  m.construct_rss_bytes = peak.growth();
  m.bytes_computed = tensor_bytes(*model);
  if (options.world > 1) {
    start = std::chrono::steady_clock::now();
    const torchdefer::Shard shard{options.rank, options.world};
    torch::NoGradGuard no_grad;
    for (at::Tensor& p : model->parameters()) {
      const std::optional<torchdefer::Box> box = shard.box_for(p.sizes());
      if (!box) {
        continue;
      }
      at::Tensor slice = p;
      for (size_t d = 0; d < box->start.size(); ++d) {
        slice = slice.narrow(static_cast<int64_t>(d), box->start[d], box->stop[d] - box->start[d]);
      }
      ++m.tensors_sliced;
      m.elements_sliced += p.numel();
      p.set_data(slice.clone());
    }
    m.materialize_s = seconds_since(start);
  }
  m.bytes_kept = tensor_bytes(*model);
  return m;
}

Measurement run_deferred(const LlamaConfig& config, const Options& options) {
  Measurement m;
  const PhasePeak peak;
  auto start = std::chrono::steady_clock::now();
  auto model = torchdefer::deferred_init([&] { return Llama(config); });
  m.construct_s = seconds_since(start);
  m.construct_rss_bytes = peak.growth();
  torchdefer::MaterializeOptions materialize;
  if (options.strategy == "deferred-shard") {
    materialize.shard(torchdefer::Shard{options.rank, options.world});
  }
  start = std::chrono::steady_clock::now();
  const torchdefer::MaterializeStats stats = torchdefer::materialize_module(*model, materialize);
  m.materialize_s = seconds_since(start);
  for (const torchdefer::TensorStats& t : stats.tensors) {
    m.bytes_kept += t.bytes_kept;
    m.bytes_computed += t.bytes_computed;
    int64_t elements = 1;
    for (const int64_t size : t.global_sizes) {
      elements *= size;
    }
    if (!t.box) {
      ++m.tensors_whole;
    } else if (t.sliced) {
      ++m.tensors_sliced;
      m.elements_sliced += elements;
    } else {
      ++m.tensors_fallback;
      m.elements_fallback += elements;
      ++m.fallback_ops[t.fallback];
    }
  }
  return m;
}

// Constructs `config` under a FakeMode (fakes, nothing recorded): the reference the record phase
// is compared with (Note [Record phase on its own]).
void measure_meta(const LlamaConfig& config, Measurement& m) {
  const PhasePeak peak;
  const auto start = std::chrono::steady_clock::now();
  {
    torchdefer::FakeMode fake;
    Llama model(config);
    m.meta_construct_s = seconds_since(start);
    m.meta_rss_bytes = peak.growth();
  }
}

// A JSON number, or null for a measurement the kernel did not allow (-1).
std::string json_bytes(int64_t bytes) { return bytes < 0 ? "null" : std::to_string(bytes); }

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
    }
    quoted += c;
  }
  return quoted + "\"";
}

void print_json(const Options& options, const LlamaConfig& config, const Measurement& m,
                int64_t baseline_rss) {
  std::ostringstream fallbacks;
  for (const auto& [op, count] : m.fallback_ops) {
    fallbacks << (fallbacks.tellp() > 0 ? ", " : "") << json_string(op) << ": " << count;
  }
  std::printf(
      "{\"strategy\": \"cpp-%s\", \"model\": %s, \"rank\": %lld, \"world\": %lld, "
      "\"parameters\": %lld, \"threads\": %d, \"construct_s\": %.6f, \"materialize_s\": %.6f, "
      "\"wall_s\": %.6f, \"baseline_rss_bytes\": %lld, \"peak_rss_bytes\": %lld, "
      "\"bytes_kept\": %lld, \"bytes_computed\": %lld, \"tensors_sliced\": %lld, "
      "\"tensors_fallback\": %lld, \"tensors_whole\": %lld, \"elements_sliced\": %lld, "
      "\"elements_fallback\": %lld, \"fallback_ops\": {%s}, \"peak_cuda_bytes\": null, "
      "\"construct_rss_bytes\": %s, \"meta_construct_s\": %.6f, \"meta_rss_bytes\": %s}\n",
      options.strategy.c_str(), json_string(config.name).c_str(),
      static_cast<long long>(options.rank), static_cast<long long>(options.world),
      static_cast<long long>(config.parameter_count()), at::get_num_threads(), m.construct_s,
      m.materialize_s, m.construct_s + m.materialize_s, static_cast<long long>(baseline_rss),
      static_cast<long long>(std::max(proc_status_bytes("VmHWM"), baseline_rss)),
      static_cast<long long>(m.bytes_kept), static_cast<long long>(m.bytes_computed),
      static_cast<long long>(m.tensors_sliced), static_cast<long long>(m.tensors_fallback),
      static_cast<long long>(m.tensors_whole), static_cast<long long>(m.elements_sliced),
      static_cast<long long>(m.elements_fallback), fallbacks.str().c_str(),
      json_bytes(m.construct_rss_bytes).c_str(), m.meta_construct_s,
      json_bytes(m.meta_rss_bytes).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    const LlamaConfig config = LlamaConfig::named(options.model);
    int64_t baseline_rss = 0;
    auto measure = [&](const LlamaConfig& c) {
      Measurement meta;
      measure_meta(c, meta);
      torch::manual_seed(options.seed);
      baseline_rss = proc_status_bytes("VmRSS");
      Measurement m =
          options.strategy == "eager" ? run_eager(c, options) : run_deferred(c, options);
      m.meta_construct_s = meta.meta_construct_s;
      m.meta_rss_bytes = meta.meta_rss_bytes;
      return m;
    };
    // As bench/harness/strategy.py's Note [Warm-up run]: one-off first-use costs (the first
    // MT19937 jump finds the generator's characteristic polynomial) go to a tiny model first.
    measure(LlamaConfig::named("tiny"));
    const Measurement m = measure(config);
    print_json(options, config, m, baseline_rss);
  } catch (const std::exception& e) {
    std::cerr << "torchdefer_bench_strategy: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
