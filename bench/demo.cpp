// The torchdefer demo, on any machine:
//  1. records the construction of a Llama-shaped decoder (default: the 70B shape) on a fake CUDA
//     device with deferred_init, and reports its size, the time and the peak RSS;
//  2. shows how a few of its parameters will be produced (explain);
//  3. materializes a small Llama end to end and checks it bit for bit against eager construction;
//  4. materializes one rank's shard of the recorded model (default rank 0 of 64) on the CPU.
//
//   torchdefer_demo [--model llama3-70b] [--device cuda] [--verify-model llama-30m | none]
//                   [--shard RANK/WORLD | none] [--dim N --layers N --heads N --kv-heads N
//                   --ffn N --vocab N]
#include <torchdefer/op_graph.h>
#include <torchdefer/torchdefer.h>

#include <ATen/Parallel.h>
#include <sys/resource.h>

#include "bench/models/llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>

namespace {

using torchdefer::models::LlamaConfig;

struct Options {
  LlamaConfig config = LlamaConfig::named("llama3-70b");
  c10::Device device = c10::Device(c10::kCUDA, 0);
  std::optional<LlamaConfig> verify = LlamaConfig::named("llama-30m");
  std::optional<torchdefer::Shard> shard = torchdefer::Shard{0, 64};
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr
      << "torchdefer_demo: " << problem << "\n"
      << "usage: torchdefer_demo [--model NAME] [--device DEVICE] [--verify-model NAME|none]\n"
      << "                       [--dim N] [--layers N] [--heads N] [--kv-heads N] [--ffn N]\n"
      << "                       [--vocab N] [--shard RANK/WORLD|none]\n"
      << "  NAME: llama3-405b, llama3-70b (default), llama3-8b, llama3.2-1b, llama-125m,"
         " llama-30m, tiny\n"
      << "  DEVICE: the device the recorded model reports (default cuda; no GPU needed)\n"
      << "  --verify-model: the model materialized and checked against eager (default "
         "llama-30m)\n"
      << "  --shard: the rank materialized from the recorded model (default 0/64; none skips it)\n";
  std::exit(2);
}

// `value` as an integer of at least `minimum`, or the usage message naming `flag`.
int64_t integer(const std::string& flag, const std::string& value, int64_t minimum) {
  try {
    size_t used = 0;
    const int64_t n = std::stoll(value, &used);
    if (used == value.size() && n >= minimum) {
      return n;
    }
  } catch (const std::exception&) {
  }
  usage(flag + " needs an integer of at least " + std::to_string(minimum) + ", got '" + value +
        "'");
}

Options parse(int argc, char** argv) {
  Options options;
  std::map<std::string, int64_t LlamaConfig::*> sizes = {
      {"--dim", &LlamaConfig::dim},       {"--layers", &LlamaConfig::n_layers},
      {"--heads", &LlamaConfig::n_heads}, {"--kv-heads", &LlamaConfig::n_kv_heads},
      {"--ffn", &LlamaConfig::ffn_dim},   {"--vocab", &LlamaConfig::vocab_size}};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      usage("builds a fake Llama-shaped model and prints its summary");
    }
    if (i + 1 >= argc) {
      usage(flag + " needs a value");
    }
    const std::string value = argv[++i];
    if (flag == "--model") {
      try {
        options.config = LlamaConfig::named(value);
      } catch (const std::invalid_argument& e) {
        usage(e.what());
      }
    } else if (flag == "--verify-model") {
      try {
        options.verify =
            value == "none" ? std::nullopt : std::optional<LlamaConfig>(LlamaConfig::named(value));
      } catch (const std::invalid_argument& e) {
        usage(e.what());
      }
    } else if (flag == "--shard") {
      const size_t slash = value.find('/');
      if (value == "none") {
        options.shard.reset();
      } else if (slash == std::string::npos) {
        usage("--shard needs RANK/WORLD, e.g. 0/64, or none");
      } else {
        const int64_t world = integer("--shard WORLD", value.substr(slash + 1), 1);
        const int64_t rank = integer("--shard RANK", value.substr(0, slash), 0);
        if (rank >= world) {
          usage("--shard: RANK must be below WORLD, got " + value);
        }
        options.shard = torchdefer::Shard{rank, world};
      }
    } else if (flag == "--device") {
      try {
        options.device = c10::Device(value);
      } catch (const c10::Error&) {
        usage("--device: '" + value + "' is not a device (cpu, cuda, cuda:1, ...)");
      }
    } else if (auto size = sizes.find(flag); size != sizes.end()) {
      options.config.*(size->second) = integer(flag, value, 1);
      options.config.name = "custom";
    } else {
      usage("unknown flag " + flag);
    }
  }
  const LlamaConfig& c = options.config;
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 || c.head_dim() % 2 != 0) {
    usage(
        "--dim must be a multiple of --heads (with an even head size), and --heads a multiple "
        "of --kv-heads");
  }
  return options;
}

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux.
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000.0 && unit < 4) {
    bytes /= 1000.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", bytes, units[unit]);
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Step 1: record the model's construction on a fake device and summarize it.
torchdefer::models::Llama record_model(const Options& options) {
  const LlamaConfig& c = options.config;
  std::cout << "1. Recording " << c.name << " (dim " << c.dim << ", " << c.n_layers << " layers, "
            << c.n_heads << " heads, " << c.n_kv_heads << " KV heads, FFN " << c.ffn_dim
            << ", vocab " << c.vocab_size << ") with deferred_init on " << options.device << "\n";

  const auto start = std::chrono::steady_clock::now();
  auto model = torchdefer::deferred_init([&] {
    torchdefer::FakeMode on_device(options.device);
    return torchdefer::models::Llama(c);
  });
  const double seconds = seconds_since(start);

  int64_t parameters = 0;
  std::map<std::string, double> bytes_by_dtype;
  bool all_fake = true;
  for (const at::Tensor& t : model->parameters()) {
    parameters += t.numel();
    bytes_by_dtype[c10::toString(t.scalar_type())] += static_cast<double>(t.nbytes());
    all_fake = all_fake && torchdefer::is_fake(t);
  }
  double buffer_bytes = 0;
  for (const at::Tensor& t : model->buffers()) {
    buffer_bytes += static_cast<double>(t.nbytes());
  }
  std::printf("   parameters      %.3f B (%lld)\n", static_cast<double>(parameters) / 1e9,
              static_cast<long long>(parameters));
  for (const auto& [dtype, bytes] : bytes_by_dtype) {
    std::printf("   %-15s %s of parameters\n", dtype.c_str(), human_bytes(bytes).c_str());
  }
  std::printf("   buffers         %s\n", human_bytes(buffer_bytes).c_str());
  std::printf("   device          %s (fake: %s)\n",
              model->parameters().front().device().str().c_str(), all_fake ? "yes" : "NO");
  std::printf("   recorded ops    %lld\n",
              static_cast<long long>(torchdefer::detail::live_recorded_nodes()));
  std::printf("   wall time       %.3f s\n", seconds);
  std::printf("   peak RSS        %.0f MB (for a model whose weights take %s)\n", peak_rss_mb(),
              human_bytes(bytes_by_dtype["Float"]).c_str());
  return model;
}

// Step 2: how a few parameters will be produced.
void explain_some(const torchdefer::models::Llama& model) {
  std::cout << "2. How some parameters will be produced (torchdefer::explain)\n";
  const auto parameters = model->named_parameters();
  for (const char* name : {"tok_embeddings.weight", "layers.0.attention.wq.weight",
                           "layers.0.feed_forward.w2.weight", "norm.weight"}) {
    std::cout << "   " << name << ": " << torchdefer::explain(parameters[name]) << "\n";
  }
}

// Step 4: materialize one rank's shard of the recorded model, on the CPU.
void materialize_shard(torchdefer::models::Llama& model, const torchdefer::Shard& shard) {
  std::cout << "4. Materializing rank " << shard.rank << " of " << shard.world_size
            << " (dim 0, counter RNG) of the recorded model on the CPU\n";
  const auto start = std::chrono::steady_clock::now();
  const torchdefer::MaterializeStats stats = torchdefer::materialize_module(
      *model, torchdefer::MaterializeOptions().shard(shard).device(at::kCPU));
  const double seconds = seconds_since(start);
  int64_t sliced = 0;
  int64_t whole = 0;
  double kept = 0;
  double computed = 0;
  std::map<std::string, int64_t> fallbacks;
  std::map<std::string, int64_t> whole_inputs;
  for (const torchdefer::TensorStats& t : stats.tensors) {
    kept += static_cast<double>(t.bytes_kept);
    computed += static_cast<double>(t.bytes_computed);
    if (!t.box) {
      ++whole;
    } else if (t.sliced) {
      ++sliced;
      if (!t.fallback.empty()) {
        ++whole_inputs[t.fallback];
      }
    } else {
      ++fallbacks[t.fallback];
    }
  }
  std::printf("   tensors         %lld sliced, %lld whole (buffers, replicated)\n",
              static_cast<long long>(sliced), static_cast<long long>(whole));
  for (const auto& [op, count] : fallbacks) {
    std::printf("   fell back       %lld computed whole then sliced (%s)\n",
                static_cast<long long>(count), op.c_str());
  }
  for (const auto& [op, count] : whole_inputs) {
    std::printf("   whole inputs    %lld sliced, with inputs computed whole (%s)\n",
                static_cast<long long>(count), op.c_str());
  }
  std::printf("   bytes kept      %s (computed %s)\n", human_bytes(kept).c_str(),
              human_bytes(computed).c_str());
  std::printf("   wall time       %.1f s on %d threads\n", seconds, at::get_num_threads());
  std::printf("   peak RSS        %.0f MB\n", peak_rss_mb());
}

// Step 3: materialize a small model end to end and compare it with eager construction.
bool verify_small_model(const LlamaConfig& config) {
  std::cout << "3. Materializing " << config.name << " and comparing it with eager construction"
            << " (torch RNG mode, CPU)\n";
  constexpr uint64_t kSeed = 20261121;
  torch::manual_seed(kSeed);
  auto start = std::chrono::steady_clock::now();
  torchdefer::models::Llama eager(config);
  const double eager_seconds = seconds_since(start);

  torch::manual_seed(kSeed);
  start = std::chrono::steady_clock::now();
  auto deferred = torchdefer::deferred_init([&] { return torchdefer::models::Llama(config); });
  const double record_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  torchdefer::materialize_module(*deferred);
  const double materialize_seconds = seconds_since(start);

  int64_t mismatches = 0;
  int64_t parameters = 0;
  const auto eager_tensors = eager->named_parameters();
  for (const auto& item : deferred->named_parameters()) {
    parameters += item.value().numel();
    const at::Tensor& e = eager_tensors[item.key()];
    if (!torch::equal(e.reshape({-1}).view(at::kByte),
                      item.value().reshape({-1}).view(at::kByte))) {
      std::cout << "   MISMATCH: " << item.key() << "\n";
      ++mismatches;
    }
  }
  std::printf("   parameters      %.1f M\n", static_cast<double>(parameters) / 1e6);
  std::printf("   eager           %.3f s\n", eager_seconds);
  std::printf("   record          %.3f s\n", record_seconds);
  std::printf("   materialize     %.3f s\n", materialize_seconds);
  std::printf("   bitwise equal   %s\n", mismatches == 0 ? "yes, every parameter" : "NO");
  return mismatches == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    torchdefer::models::Llama model = record_model(options);
    explain_some(model);
    if (options.verify && !verify_small_model(*options.verify)) {
      return 1;
    }
    if (options.shard) {
      materialize_shard(model, *options.shard);
    }
  } catch (const std::exception& e) {
    std::cerr << "torchdefer_demo failed: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
