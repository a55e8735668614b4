// torchdefer micro benchmarks (Google Benchmark). Run with --benchmark_format=json for the tables
// in docs/benchmarks.md. Names are '/'-separated fields, parseable without looking at counters:
//
//   BM_CounterFill/<op>/<dtype>/at_threads:<n>   counter_fill of a 64 MiB pre-faulted buffer;
//       op: uniform, normal, bernoulli, random, exponential, log_normal, cauchy, geometric;
//       dtype: f32, f64, f16, bf16;
//       at_threads: ATen intra-op threads (at::set_num_threads; 1 and all cores). bytes_per_second
//       is the output written.
//   BM_CounterFillSmall/<op>/<dtype>/at_threads:<n>  counter_fill of 4M pre-faulted elements,
//       op: trunc_normal (trunc_normal_(mean 0, std 0.02, a −0.04, b 0.04): its erfinv makes
//       an element ~15x a normal one, too slow for 64 MiB) and normal beside it; dtype: f32,
//       bf16.
//   BM_CounterFillFresh/uniform/f32/at_threads:<n>  the same into a newly allocated 64 MiB
//       tensor each iteration: the difference to BM_CounterFill is the page faults.
//   BM_TorchFill/<op>/<dtype>/at_threads:<n>     PyTorch's own op on the same kind of buffer, in
//       the same run: uniform_ and normal_ (its CPU generator), fill_ (the memory-bandwidth bound).
//   BM_Record/<mode>/<model>                     constructing <model> (linear-4096: one
//       torch::nn::Linear(4096, 4096); llama-125m, llama3-8b, llama3-70b: bench/models/llama.h)
//       with mode deferred_init (recorded) or fake_mode (under a torchdefer::FakeMode: fakes,
//       nothing recorded — the C++ frontend has no meta-device context, and this is its equivalent:
//       no storage, no initialization). Counters: ops and params (per model), s_per_op and
//       s_per_param (time divided by them; the same op count for both modes, so the two modes
//       compare per op). Destroying the model is not timed, nor is waiting for the generator
//       jump of the recording before (every construction here starts with none pending).
//   BM_RecordAlternating/<model>                 two deferred_init of <model>, then two
//       constructions under a FakeMode, per iteration, in one process so that both see the same
//       load (Note [Alternating by pairs]); counters: record_cpu_s and fake_mode_cpu_s (this
//       thread's CPU time per construction) and their ratio, the figure issue 12's 1.1× target is
//       about; same_kind_ratio and cross_ratio, the same of the constructions that follow one of
//       their own kind and of those that follow the other; process_ratio, ratio in process CPU
//       with each recording's generator jump. Real time covers the four constructions, their
//       teardowns and the waits for the jumps.
//   BM_Mt19937Jump/draws:<n>                     torchdefer::mt19937_discard of a seeded MT19937
//       engine by n words (the jump the recorder makes at the end of a deferred_init that drew n
//       words): 10^4 runs the recurrence, longer ones jump by polynomial (Note [MT19937
//       jump-ahead]).
//   BM_ShardReplay/world:<W>/at_threads:<n>      materialize_module of one recorded
//       torch::nn::Linear(8192, 8192) (256 MiB of float32, kaiming_uniform_) as the shard of rank
//       0 of W (Shard{0, W}, counter RNG), W = 1, 2, 4, ..., 64; bytes_per_second is the shard's
//       bytes (new memory: page faults included), so time should fall ~1/W. Recording is not
//       timed.
//
// Every benchmark reports wall time (UseRealTime), since the work runs on ATen's thread pool.
#include <benchmark/benchmark.h>
#include <torch/torch.h>
#include <torchdefer/counter_rng.h>
#include <torchdefer/mt19937_jump.h>
#include <torchdefer/op_graph.h>
#include <torchdefer/torchdefer.h>

#include "bench/models/llama.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using torchdefer::CounterDistribution;
using torchdefer::CounterDistributionParams;

constexpr int64_t kFillBytes = int64_t{64} << 20;

struct DtypeName {
  c10::ScalarType dtype;
  const char* name;
};

const std::vector<DtypeName>& fill_dtypes() {
  static const std::vector<DtypeName> dtypes = {
      {at::kFloat, "f32"}, {at::kDouble, "f64"}, {at::kHalf, "f16"}, {at::kBFloat16, "bf16"}};
  return dtypes;
}

std::vector<int> thread_counts() {
  const int all = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return all == 1 ? std::vector<int>{1} : std::vector<int>{1, all};
}

// A buffer of kFillBytes, written once so that its pages are faulted in before timing.
at::Tensor prefaulted(c10::ScalarType dtype) {
  const int64_t numel = kFillBytes / static_cast<int64_t>(c10::elementSize(dtype));
  return torch::zeros({numel}, dtype);
}

void run_fill(benchmark::State& state, c10::ScalarType dtype, int threads,
              const std::function<void(at::Tensor&)>& fill) {
  at::set_num_threads(threads);
  at::Tensor buffer = prefaulted(dtype);
  for (auto _ : state) {
    fill(buffer);
    benchmark::DoNotOptimize(buffer.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(buffer.nbytes()));
  state.counters["at_threads"] = threads;
}

void register_counter_fill() {
  struct Op {
    const char* name;
    CounterDistributionParams params;
  };
  CounterDistributionParams random{CounterDistribution::kRandom};
  random.range = 1000;
  const std::vector<Op> ops = {{"uniform", {CounterDistribution::kUniform, -0.1, 0.1}},
                               {"normal", {CounterDistribution::kNormal, 0.0, 0.02}},
                               {"bernoulli", {CounterDistribution::kBernoulli, 0.9}},
                               {"random", random},
                               {"exponential", {CounterDistribution::kExponential, 1.0}},
                               {"log_normal", {CounterDistribution::kLogNormal, 0.0, 0.5}},
                               {"cauchy", {CounterDistribution::kCauchy, 0.0, 1.0}},
                               {"geometric", {CounterDistribution::kGeometric, 0.25}}};
  for (const Op& op : ops) {
    for (const DtypeName& dtype : fill_dtypes()) {
      for (const int threads : thread_counts()) {
        const std::string name = std::string("BM_CounterFill/") + op.name + "/" + dtype.name +
                                 "/at_threads:" + std::to_string(threads);
        const CounterDistributionParams params = op.params;
        benchmark::RegisterBenchmark(
            name.c_str(),
            [params, dtype, threads](benchmark::State& state) {
              run_fill(state, dtype.dtype, threads, [&](at::Tensor& buffer) {
                torchdefer::counter_fill(buffer, params, /*seed=*/42, /*stream=*/7);
              });
            })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

// trunc_normal_ is too slow for the 64 MiB buffer of BM_CounterFill, so it and normal_ for
// comparison fill 4M elements.
void register_small_counter_fill() {
  constexpr int64_t kSmallNumel = int64_t{4} << 20;
  CounterDistributionParams truncated{CounterDistribution::kTruncatedNormal, 0.0, 0.02};
  truncated.low = -0.04;
  truncated.high = 0.04;
  const std::vector<std::pair<const char*, CounterDistributionParams>> ops = {
      {"trunc_normal", truncated}, {"normal", {CounterDistribution::kNormal, 0.0, 0.02}}};
  const std::vector<DtypeName> dtypes = {{at::kFloat, "f32"}, {at::kBFloat16, "bf16"}};
  for (const auto& [op, params] : ops) {
    for (const DtypeName& dtype : dtypes) {
      for (const int threads : thread_counts()) {
        const std::string name = std::string("BM_CounterFillSmall/") + op + "/" + dtype.name +
                                 "/at_threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [params = params, dtype, threads](benchmark::State& state) {
                                       at::set_num_threads(threads);
                                       at::Tensor buffer = torch::zeros({kSmallNumel}, dtype.dtype);
                                       for (auto _ : state) {
                                         torchdefer::counter_fill(buffer, params, 42, 7);
                                         benchmark::DoNotOptimize(buffer.data_ptr());
                                         benchmark::ClobberMemory();
                                       }
                                       state.SetItemsProcessed(state.iterations() * kSmallNumel);
                                       state.counters["at_threads"] = threads;
                                     })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

void register_fresh_fill() {
  for (const int threads : thread_counts()) {
    const std::string name =
        "BM_CounterFillFresh/uniform/f32/at_threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(
        name.c_str(),
        [threads](benchmark::State& state) {
          at::set_num_threads(threads);
          const CounterDistributionParams uniform{CounterDistribution::kUniform, -0.1, 0.1};
          for (auto _ : state) {
            at::Tensor buffer = torch::empty({kFillBytes / 4});
            torchdefer::counter_fill(buffer, uniform, 42, 7);
            benchmark::DoNotOptimize(buffer.data_ptr());
          }
          state.SetBytesProcessed(state.iterations() * kFillBytes);
          state.counters["at_threads"] = threads;
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

void register_torch_fill() {
  const std::vector<std::pair<const char*, std::function<void(at::Tensor&)>>> ops = {
      {"uniform_", [](at::Tensor& t) { t.uniform_(-0.1, 0.1); }},
      {"normal_", [](at::Tensor& t) { t.normal_(0.0, 0.02); }},
      {"fill_", [](at::Tensor& t) { t.fill_(0.5); }}};
  for (const auto& [op_name, op] : ops) {
    for (const DtypeName& dtype : fill_dtypes()) {
      for (const int threads : thread_counts()) {
        const std::string name = std::string("BM_TorchFill/") + op_name + "/" + dtype.name +
                                 "/at_threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(),
                                     [op = op, dtype, threads](benchmark::State& state) {
                                       run_fill(state, dtype.dtype, threads, op);
                                     })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

struct ModelSpec {
  const char* name;
  std::function<std::shared_ptr<torch::nn::Module>()> build;
};

const std::vector<ModelSpec>& record_models() {
  static const std::vector<ModelSpec> models = {
      {"linear-4096", [] { return torch::nn::Linear(4096, 4096).ptr(); }},
      {"llama-125m",
       [] {
         return torchdefer::models::Llama(torchdefer::models::LlamaConfig::named("llama-125m"))
             .ptr();
       }},
      {"llama3-8b",
       [] {
         return torchdefer::models::Llama(torchdefer::models::LlamaConfig::named("llama3-8b"))
             .ptr();
       }},
      {"llama3-70b", [] {
         return torchdefer::models::Llama(torchdefer::models::LlamaConfig::named("llama3-70b"))
             .ptr();
       }}};
  return models;
}

// Recorded ops and parameters of one deferred_init of `model`.
std::pair<int64_t, int64_t> recording_size(const ModelSpec& model) {
  const auto module = torchdefer::deferred_init(model.build);
  const std::vector<at::Tensor> parameters = module->parameters();
  const torchdefer::RecordedFake* recorded = torchdefer::recorded(parameters.front());
  TORCH_CHECK(recorded != nullptr, "micro_bench: ", model.name, " recorded nothing");
  return {static_cast<int64_t>(recorded->graph->nodes().size()),
          static_cast<int64_t>(parameters.size())};
}

// Returns once no generator jump of an earlier recording is pending (Note [The jump in the
// background]), so that every construction starts as a script's single deferred_init does: a
// recording that starts during a jump skips its generator checks while the worker holds the
// generator (Note [A recording that starts during a jump]).
void wait_for_pending_jump() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
}

// `model` recorded by deferred_init, or built under a FakeMode (no recording): what BM_Record and
// BM_RecordAlternating compare.
std::shared_ptr<torch::nn::Module> construct(const ModelSpec& model, bool deferred) {
  if (deferred) {
    return torchdefer::deferred_init(model.build);
  }
  torchdefer::FakeMode fake;
  return model.build();
}

void register_record() {
  for (const ModelSpec& model : record_models()) {
    for (const bool deferred : {true, false}) {
      const std::string name =
          std::string("BM_Record/") + (deferred ? "deferred_init/" : "fake_mode/") + model.name;
      benchmark::RegisterBenchmark(
          name.c_str(),
          [&model, deferred](benchmark::State& state) {
            at::set_num_threads(1);
            const auto [ops, params] = recording_size(model);
            for (auto _ : state) {
              std::shared_ptr<torch::nn::Module> module = construct(model, deferred);
              benchmark::DoNotOptimize(module.get());
              state.PauseTiming();
              module.reset();
              wait_for_pending_jump();
              state.ResumeTiming();
            }
            using benchmark::Counter;
            state.counters["ops"] = static_cast<double>(ops);
            state.counters["params"] = static_cast<double>(params);
            state.counters["s_per_op"] = Counter(
                static_cast<double>(ops), Counter::kIsIterationInvariantRate | Counter::kInvert);
            state.counters["s_per_param"] = Counter(
                static_cast<double>(params), Counter::kIsIterationInvariantRate | Counter::kInvert);
          })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

double cpu_seconds(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// CPU seconds of one construction of `model`, recorded or under a FakeMode: this thread's, and the
// process's until the recording's generator jump is made (the worker's share included).
struct ConstructionCpu {
  double thread = 0;
  double process = 0;

  ConstructionCpu& operator+=(const ConstructionCpu& other) {
    thread += other.thread;
    process += other.process;
    return *this;
  }
};

ConstructionCpu construction_cpu(const ModelSpec& model, bool deferred) {
  wait_for_pending_jump();
  const double thread_start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  const double process_start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  std::shared_ptr<torch::nn::Module> module = construct(model, deferred);
  benchmark::DoNotOptimize(module.get());
  ConstructionCpu cpu;
  cpu.thread = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread_start;
  wait_for_pending_jump();
  cpu.process = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process_start;
  return cpu;
}

// Note [Alternating by pairs]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A construction's time depends on the one before it: a FakeMode construction runs ~4% faster
// right after a recording than after one of its own kind, and a recording ~2% slower right after a
// FakeMode construction (docs/results.md), with the same instructions. Each kind in only one of
// those places would favour one side, so every iteration constructs each kind twice (recording,
// recording, FakeMode, FakeMode): each is measured once after its own kind and once after the
// other, and `ratio`, the target's figure, pools all of them. `same_kind_ratio` and `cross_ratio`
// are its two halves, and `process_ratio` is `ratio` in process CPU, with the recording's
// generator jump, which the worker makes after deferred_init returns (Note [The jump in the
// background]).
void register_record_alternating() {
  for (const ModelSpec& model : record_models()) {
    const std::string name = std::string("BM_RecordAlternating/") + model.name;
    benchmark::RegisterBenchmark(
        name.c_str(),
        [&model](benchmark::State& state) {
          at::set_num_threads(1);
          ConstructionCpu recorded_after_recorded;
          ConstructionCpu recorded_after_fake;
          ConstructionCpu fake_after_recorded;
          ConstructionCpu fake_after_fake;
          for (auto _ : state) {
            recorded_after_fake += construction_cpu(model, true);
            recorded_after_recorded += construction_cpu(model, true);
            fake_after_recorded += construction_cpu(model, false);
            fake_after_fake += construction_cpu(model, false);
          }
          const auto ratio = [](double recorded, double fake) {
            return fake > 0 ? recorded / fake : 0;
          };
          const double recorded = recorded_after_fake.thread + recorded_after_recorded.thread;
          const double fake = fake_after_recorded.thread + fake_after_fake.thread;
          using benchmark::Counter;
          state.counters["record_cpu_s"] = Counter(recorded / 2, Counter::kAvgIterations);
          state.counters["fake_mode_cpu_s"] = Counter(fake / 2, Counter::kAvgIterations);
          state.counters["ratio"] = ratio(recorded, fake);
          state.counters["same_kind_ratio"] =
              ratio(recorded_after_recorded.thread, fake_after_fake.thread);
          state.counters["cross_ratio"] =
              ratio(recorded_after_fake.thread, fake_after_recorded.thread);
          state.counters["process_ratio"] =
              ratio(recorded_after_fake.process + recorded_after_recorded.process,
                    fake_after_recorded.process + fake_after_fake.process);
        })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

void register_mt19937_jump() {
  for (const uint64_t draws : {uint64_t{10'000}, uint64_t{16'777'216}, uint64_t{8'030'000'000},
                               uint64_t{70'600'000'000}}) {
    const std::string name = "BM_Mt19937Jump/draws:" + std::to_string(draws);
    benchmark::RegisterBenchmark(name.c_str(),
                                 [draws](benchmark::State& state) {
                                   at::mt19937 warm(1);
                                   torchdefer::mt19937_discard(warm, draws);
                                   at::mt19937 engine(42);
                                   for (auto _ : state) {
                                     torchdefer::mt19937_discard(engine, draws);
                                     benchmark::DoNotOptimize(engine.data());
                                   }
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

void register_shard_replay() {
  for (int64_t world = 1; world <= 64; world *= 2) {
    for (const int threads : thread_counts()) {
      const std::string name = "BM_ShardReplay/world:" + std::to_string(world) +
                               "/at_threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(
          name.c_str(),
          [world, threads](benchmark::State& state) {
            at::set_num_threads(threads);
            int64_t bytes = 0;
            for (auto _ : state) {
              state.PauseTiming();
              auto linear = torchdefer::deferred_init<torch::nn::Linear>(
                  torch::nn::LinearOptions(8192, 8192).bias(false));
              state.ResumeTiming();
              torchdefer::materialize_module(
                  *linear, torchdefer::MaterializeOptions().shard(torchdefer::Shard{0, world}));
              bytes += static_cast<int64_t>(linear->weight.nbytes());
              state.PauseTiming();
              linear = nullptr;
              state.ResumeTiming();
            }
            state.SetBytesProcessed(bytes);
            state.counters["world"] = static_cast<double>(world);
            state.counters["at_threads"] = threads;
          })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_counter_fill();
  register_small_counter_fill();
  register_fresh_fill();
  register_torch_fill();
  register_record();
  register_record_alternating();
  register_mt19937_jump();
  register_shard_replay();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
