// The torchdefer demo: builds a Llama-shaped decoder (default: the 70B shape) under a fake CUDA
// device on any machine and reports what it would take, in seconds and a few hundred MB.
//
//   torchdefer_demo [--model llama3-70b] [--device cuda] [--dim N --layers N --heads N
//                    --kv-heads N --ffn N --vocab N]
#include <torchdefer/torchdefer.h>

#include <sys/resource.h>

#include "bench/models/llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

namespace {

using torchdefer::models::LlamaConfig;

struct Options {
  LlamaConfig config = LlamaConfig::named("llama3-70b");
  c10::Device device = c10::Device(c10::kCUDA, 0);
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "torchdefer_demo: " << problem << "\n"
            << "usage: torchdefer_demo [--model NAME] [--device DEVICE] [--dim N] [--layers N]\n"
            << "                       [--heads N] [--kv-heads N] [--ffn N] [--vocab N]\n"
            << "  NAME: llama3-405b, llama3-70b (default), llama3-8b, llama3.2-1b, llama-125m,"
               " tiny\n"
            << "  DEVICE: the device the fake model reports (default cuda; no GPU needed)\n";
  std::exit(2);
}

int64_t positive(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const int64_t n = std::stoll(value, &used);
    if (used == value.size() && n > 0) {
      return n;
    }
  } catch (const std::exception&) {
  }
  usage(flag + " needs a positive integer, got '" + value + "'");
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
    } else if (flag == "--device") {
      try {
        options.device = c10::Device(value);
      } catch (const c10::Error&) {
        usage("--device: '" + value + "' is not a device (cpu, cuda, cuda:1, ...)");
      }
    } else if (auto size = sizes.find(flag); size != sizes.end()) {
      options.config.*(size->second) = positive(flag, value);
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

// Step 1: build the model under a fake device and summarize it.
void summarize_fake_model(const Options& options) {
  const LlamaConfig& c = options.config;
  std::cout << "Building " << c.name << " (dim " << c.dim << ", " << c.n_layers << " layers, "
            << c.n_heads << " heads, " << c.n_kv_heads << " KV heads, FFN " << c.ffn_dim
            << ", vocab " << c.vocab_size << ") under FakeMode(" << options.device << ")\n";

  const auto start = std::chrono::steady_clock::now();
  torchdefer::FakeMode fake(options.device);
  torchdefer::models::Llama model(c);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int64_t parameters = 0;
  std::map<std::string, double> bytes_by_dtype;
  c10::Device device = options.device;
  bool all_fake = true;
  for (const at::Tensor& t : model->parameters()) {
    parameters += t.numel();
    bytes_by_dtype[c10::toString(t.scalar_type())] += static_cast<double>(t.nbytes());
    device = t.device();
    all_fake = all_fake && torchdefer::is_fake(t);
  }
  double buffer_bytes = 0;
  for (const at::Tensor& t : model->buffers()) {
    buffer_bytes += static_cast<double>(t.nbytes());
  }

  std::printf("  parameters      %.3f B (%lld)\n", static_cast<double>(parameters) / 1e9,
              static_cast<long long>(parameters));
  for (const auto& [dtype, bytes] : bytes_by_dtype) {
    std::printf("  %-15s %s of parameters\n", dtype.c_str(), human_bytes(bytes).c_str());
  }
  std::printf("  buffers         %s\n", human_bytes(buffer_bytes).c_str());
  std::printf("  device          %s (fake: %s)\n", device.str().c_str(), all_fake ? "yes" : "NO");
  std::printf("  wall time       %.3f s\n", seconds);
  std::printf("  peak RSS        %.0f MB (for a model whose weights take %s)\n", peak_rss_mb(),
              human_bytes(bytes_by_dtype["Float"]).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    summarize_fake_model(options);
  } catch (const std::exception& e) {
    std::cerr << "torchdefer_demo failed: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
