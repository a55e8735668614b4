// Counter RNG (Note [Counter RNG]). Compiled with -ffp-contract=off (replay/CMakeLists.txt).
#include <torchdefer/counter_rng.h>

#include "counter_math.h"
#include "counter_rng_device.h"
#include "counter_rng_simd.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/view_as_real.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace torchdefer {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  counter_math::portable::philox_rounds<uint32_t>(c.data(), k[0], k[1]);
  return c;
}

namespace counter_math {

double log(double x) { return portable::log<double>(x); }

double exp(double x) { return portable::exp(x); }

void sincos_2pi(double t, double* sin, double* cos) { portable::sincos_2pi<double>(t, sin, cos); }

double erf(double x) { return portable::erf(x); }

double erfinv(double u) { return portable::erfinv(u); }

}  // namespace counter_math

counter_math::ElementParams element_params(const CounterDistributionParams& p, uint64_t seed,
                                           uint64_t stream) {
  counter_math::ElementParams e;
  e.distribution = p.distribution;
  e.a = p.a;
  e.b = p.b;
  e.from = p.from;
  e.range = p.range;
  e.low = p.low;
  e.high = p.high;
  e.seed = seed;
  e.stream = stream;
  return e;
}

namespace {

namespace math = counter_math;

static_assert(sizeof(math::HalfBits) == sizeof(c10::Half) &&
              sizeof(math::BFloat16Bits) == sizeof(c10::BFloat16));

#if defined(__x86_64__)
#define TORCHDEFER_X86_KERNELS 1

// Note [Vectorized counter fill]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Initialization is almost all uniform, normal and truncated-normal draws, so those (and
// bernoulli, exponential, log-normal, Cauchy, geometric and random over at most 2^32 values)
// have vector kernels for float32, float64, float16 and bfloat16 outputs. Their Philox
// rounds, log, exp, sincos, erfinv and Box–Muller are counter_math.h's templates instantiated for
// vector lanes (Note [One definition of the counter math]): the same IEEE operations in the same
// order, lane by lane, as the scalar path and the CUDA kernel; the rest (where each element's words
// sit, the correctly rounded conversions and stores) is the kernel's own. counter_rng_test.cpp
// checks every kernel element by element against a reference written from Note [Counter RNG],
// across region offsets that start and end mid-block and mid-group.
//
//  * AVX-512 (F, DQ, BW, VL; counter_rng_avx512.cpp, its own translation unit compiled for that
//    instruction set): every kernel above. Philox runs four independent sets of 16 blocks at once
//    (one set alone is a latency-bound chain of multiplies), the counters laid out so that one
//    in-lane 4x4 transpose leaves the words in element order.
//  * AVX2 with FMA and F16C (counter_rng_avx2.cpp, likewise): uniform, normal and truncated
//    normal in float32, float16 and bfloat16, the same scheme with four sets of eight blocks, for
//    CPUs without AVX-512.
//  * Truncated normal, every dtype: the whole element on AVX-512 lanes, and on AVX2 lanes but for
//    float64, whose erfinv alone runs on AVX2 lanes (Note [Vectorized truncated normal]).
//  * Otherwise the scalar path. The choice is made at run time from cpuid, so the library runs on
//    any x86-64 CPU. TORCHDEFER_CPU_CAPABILITY=scalar|avx2|avx512 caps it (as ATEN_CPU_CAPABILITY
//    does ATen's kernels), so that tests and benchmarks run every path on one machine.
enum class Isa { kScalar, kAvx2, kAvx512 };

Isa detect_isa() {
  Isa isa = Isa::kScalar;
  if (counter_simd::avx2_available()) {
    isa = Isa::kAvx2;
  }
  if (counter_simd::avx512_available()) {
    isa = Isa::kAvx512;
  }
  const char* cap = std::getenv("TORCHDEFER_CPU_CAPABILITY");
  if (cap == nullptr || *cap == '\0') {
    return isa;
  }
  const std::string requested(cap);
  TORCH_CHECK(requested == "scalar" || requested == "avx2" || requested == "avx512",
              "torchdefer: TORCHDEFER_CPU_CAPABILITY='", requested,
              "' is not one of scalar, avx2, avx512; unset it to use the best the CPU supports");
  const Isa limit = requested == "scalar" ? Isa::kScalar
                    : requested == "avx2" ? Isa::kAvx2
                                          : Isa::kAvx512;
  return std::min(isa, limit);
}

Isa counter_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

#endif

template <typename T>
constexpr std::optional<counter_simd::Dtype> simd_dtype() {
  if constexpr (std::is_same_v<T, float>) {
    return counter_simd::Dtype::kFloat;
  } else if constexpr (std::is_same_v<T, double>) {
    return counter_simd::Dtype::kDouble;
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    return counter_simd::Dtype::kHalf;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return counter_simd::Dtype::kBFloat16;
  }
  return std::nullopt;
}

std::optional<counter_simd::Op> simd_op(CounterDistribution distribution) {
  switch (distribution) {
    case CounterDistribution::kUniform:
      return counter_simd::Op::kUniform;
    case CounterDistribution::kNormal:
      return counter_simd::Op::kNormal;
    case CounterDistribution::kBernoulli:
      return counter_simd::Op::kBernoulli;
    case CounterDistribution::kExponential:
      return counter_simd::Op::kExponential;
    case CounterDistribution::kTruncatedNormal:
      return counter_simd::Op::kTruncatedNormal;
    case CounterDistribution::kLogNormal:
      return counter_simd::Op::kLogNormal;
    case CounterDistribution::kCauchy:
      return counter_simd::Op::kCauchy;
    case CounterDistribution::kGeometric:
      return counter_simd::Op::kGeometric;
    case CounterDistribution::kRandom:
      return counter_simd::Op::kRandom;
    default:
      return std::nullopt;
  }
}

#ifdef TORCHDEFER_X86_KERNELS

// Note [Vectorized truncated normal]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A truncated normal element is a uniform, erfinv (a logarithm and a polynomial of degree 24:
// Note [Counter scheme versions], version 2), a scale, a clamp and a rounding. The AVX-512
// kernel computes all of it on vector lanes, for every floating dtype, and the AVX2 kernel for
// all but float64, with the tail's polynomials evaluated only for the vectors that need them. For
// float64 with AVX2 the uniforms, clamping and rounding stay on the scalar path and erfinv runs
// on vector lanes, a chunk of elements at a time (counter_rng_erfinv.h). Each lane computes
// the scalar definition's operations in order, so the bits are the scalar path's, which
// counter_rng_test.cpp checks element by element.
template <typename S>
int64_t truncated_normal_fill(S* out, uint64_t e, int64_t count, const math::ElementParams& params,
                              math::Draws& draws) {
  double u[counter_simd::kErfinvChunk];
  double z[counter_simd::kErfinvChunk];
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min(counter_simd::kErfinvChunk, count - done);
    for (int64_t j = 0; j < n; ++j) {
      u[j] = math::truncated_normal_uniform(params, draws, e + static_cast<uint64_t>(done + j));
    }
    counter_simd::erfinv_avx2(u, z, n);
    for (int64_t j = 0; j < n; ++j) {
      out[done + j] = math::truncated_normal_value<S>(params, z[j]);
    }
    done += n;
  }
  return count;
}

#endif

// Fills a prefix of the `count` contiguous elements from element `e` with a vector kernel (Note
// [Vectorized counter fill], Note [Vectorized truncated normal]): all of them, or none where no
// kernel covers the distribution and dtype. Returns how many it filled.
template <typename T>
int64_t vector_fill(CounterElement<T>* out, uint64_t e, int64_t count,
                    const math::ElementParams& params, math::Draws& draws) {
#ifdef TORCHDEFER_X86_KERNELS
  if (params.distribution == CounterDistribution::kTruncatedNormal && counter_isa() == Isa::kAvx2 &&
      std::is_same_v<T, double>) {
    return truncated_normal_fill(out, e, count, params, draws);
  }
#endif
  constexpr std::optional<counter_simd::Dtype> dtype = simd_dtype<T>();
  const std::optional<counter_simd::Op> op =
      simd_op(static_cast<CounterDistribution>(params.distribution));
  if (!dtype || !op || (*op == counter_simd::Op::kRandom && params.wide)) {
    return 0;
  }
#ifdef TORCHDEFER_X86_KERNELS
  const Isa isa = counter_isa();
  const bool avx512 = isa == Isa::kAvx512;
  const bool avx2 = isa == Isa::kAvx2 && *dtype != counter_simd::Dtype::kDouble &&
                    (*op == counter_simd::Op::kUniform || *op == counter_simd::Op::kNormal ||
                     *op == counter_simd::Op::kTruncatedNormal);
  if (!avx512 && !avx2) {
    return 0;
  }
  counter_simd::Job job;
  job.op = *op;
  job.dtype = *dtype;
  job.a = params.a;
  job.b = params.b;
  job.low = params.low;
  job.high = params.high;
  job.u_low = params.u_low;
  job.u_high = params.u_high;
  job.from = params.from;
  job.range = params.range == 0 ? math::default_random_range<CounterElement<T>>() : params.range;
  job.seed = params.seed;
  job.stream = params.stream;
  // Note [Partial groups]
  // ~~~~~~~~~~~~~~~~~~~~~
  // The kernels fill whole groups of Philox blocks from a block boundary. The elements of a
  // partial group at either end of the run are copied out of a whole group filled into a
  // scratch buffer: a few hundred elements computed for nothing, instead of the scalar path for
  // up to a group's worth. A column shard's rows (64 elements of a 4096-wide weight split 64
  // ways) and a parallel chunk's ends stay on the vector path.
  using S = CounterElement<T>;
  const int64_t per_block = params.wide ? 2 : 4;
  const int64_t group =
      per_block * (avx512 ? counter_simd::kAvx512GroupBlocks : counter_simd::kAvx2GroupBlocks);
  const auto fill = avx512 ? counter_simd::fill_avx512 : counter_simd::fill_avx2;
  const auto from_scratch = [&](uint64_t first, int64_t skip, int64_t n, S* destination) {
    S scratch[4 * counter_simd::kAvx512GroupBlocks];
    job.out = scratch;
    job.first = first;
    job.count = group;
    fill(job);
    std::copy(scratch + skip, scratch + skip + n, destination);
  };
  int64_t j = 0;
  const auto head = static_cast<int64_t>(e % static_cast<uint64_t>(per_block));
  if (head != 0) {
    j = std::min(count, group - head);
    from_scratch(e - static_cast<uint64_t>(head), head, j, out);
  }
  if (j < count) {
    job.out = out + j;
    job.first = e + static_cast<uint64_t>(j);
    job.count = count - j;
    j += fill(job);
  }
  if (j < count) {
    from_scratch(e + static_cast<uint64_t>(j), 0, count - j, out + j);
  }
  return count;
#else
  return 0;
#endif
}

template <typename T>
void fill_typed(const at::Tensor& out, const math::ElementParams& generic,
                const CounterLayout& index) {
  using S = CounterElement<T>;
  const math::ElementParams params = math::for_dtype<S>(generic);
  const int64_t dims = out.dim();
  const int64_t row_length = dims == 0 ? 1 : out.size(dims - 1);
  const int64_t rows = row_length == 0 ? 0 : out.numel() / row_length;
  const int64_t last_stride = dims == 0 ? 1 : out.stride(dims - 1);
  const int64_t last_global_stride = dims == 0 ? 1 : index.global_strides[dims - 1];
  S* data = reinterpret_cast<S*>(out.data_ptr<T>());
  // Split by elements, not rows, so that a long 1-D tensor uses every thread too, in chunks of
  // whole kernel groups (Note [Partial groups]), and from 8,192 elements on: a few tens of
  // microseconds of work, several times what waking a thread costs.
  const int64_t numel = rows * row_length;
  constexpr int64_t kChunk = 4 * counter_simd::kAvx512GroupBlocks;
  constexpr int64_t kGrainElements = 8192;
  const int64_t chunks = (numel + kChunk - 1) / kChunk;
  const auto fill_elements = [&](int64_t begin, int64_t end) {
    math::Draws draws(params);
    int64_t k = begin;
    while (k < end) {
      const int64_t row = k / row_length;
      const int64_t first = k % row_length;
      const int64_t last = std::min(row_length, first + (end - k));
      int64_t rest = row;
      int64_t offset = 0;
      int64_t global = 0;
      for (int64_t d = dims - 2; d >= 0; --d) {
        const int64_t i = rest % out.size(d);
        rest /= out.size(d);
        offset += i * out.stride(d);
        global += (index.start[d] + i) * index.global_strides[d];
      }
      if (dims > 0) {
        global += index.start[dims - 1] * last_global_stride;
      }
      int64_t j = first;
      if (last_stride == 1) {
        j += vector_fill<T>(data + offset + j, static_cast<uint64_t>(global + j), last - j, params,
                            draws);
      }
      for (; j < last; ++j) {
        data[offset + j * last_stride] =
            math::element<S>(params, draws, static_cast<uint64_t>(global + j));
      }
      k += last - first;
    }
  };
  at::parallel_for(0, chunks, kGrainElements / kChunk, [&](int64_t first, int64_t last) {
    fill_elements(first * kChunk, std::min(numel, last * kChunk));
  });
}

}  // namespace

namespace counter_simd {

bool avx2_available() {
#ifdef TORCHDEFER_X86_KERNELS
  static const bool available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                __builtin_cpu_supports("f16c");
  return available;
#else
  return false;
#endif
}

bool avx512_available() {
#ifdef TORCHDEFER_X86_KERNELS
  static const bool available =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return available;
#else
  return false;
#endif
}

}  // namespace counter_simd

const char* counter_fill_isa() {
#ifdef TORCHDEFER_X86_KERNELS
  switch (counter_isa()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
#endif
  return "scalar";
}

bool counter_fill_has_cuda_kernel() {
#ifdef TORCHDEFER_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// Note [Merged rows]
// ~~~~~~~~~~~~~~~~~~
// fill_typed walks `out` one row (last dimension) at a time, and the vector kernels fill whole
// groups of elements within a row; a conv weight [256, 64, 3, 3] has rows of 3, all of which
// would take the scalar path. So adjacent dimensions that are contiguous with each other in
// `out`, and that the region covers fully in the inner one, are merged first: a whole contiguous
// tensor becomes one row. The global row-major index of every element is unchanged: for a fully
// covered inner dimension of global size G, (s + i) * G * g + j * g == (s * G + i * G + j) * g.
CounterLayout merge_rows(const at::Tensor& out, c10::IntArrayRef global,
                         const std::vector<int64_t>& start) {
  CounterLayout layout;
  std::vector<int64_t> merged_global;
  for (int64_t d = 0; d < out.dim(); ++d) {
    const bool merges = !layout.sizes.empty() &&
                        layout.strides.back() == out.stride(d) * out.size(d) && start[d] == 0 &&
                        out.size(d) == global[d];
    if (merges) {
      layout.sizes.back() *= out.size(d);
      layout.strides.back() = out.stride(d);
      merged_global.back() *= global[d];
      layout.start.back() *= global[d];
      continue;
    }
    layout.sizes.push_back(out.size(d));
    layout.strides.push_back(out.stride(d));
    merged_global.push_back(global[d]);
    layout.start.push_back(start[d]);
  }
  layout.global_strides.assign(layout.sizes.size(), 1);
  for (int64_t d = static_cast<int64_t>(layout.sizes.size()) - 2; d >= 0; --d) {
    layout.global_strides[d] = layout.global_strides[d + 1] * merged_global[d + 1];
  }
  return layout;
}

namespace {

void fill_on_cpu(const at::Tensor& out, const math::ElementParams& params, c10::IntArrayRef global,
                 const std::vector<int64_t>& start) {
  const CounterLayout layout = merge_rows(out, global, start);
  const at::Tensor rows = out.as_strided(layout.sizes, layout.strides, out.storage_offset());
  AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, out.scalar_type(),
                             "torchdefer_counter_fill",
                             [&] { fill_typed<scalar_t>(rows, params, layout); });
}

// Note [Counter fill on other devices]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The CPU fill writes through data_ptr from host threads, which on an accelerator would be a host
// write to device memory. A device with a native kernel (CUDA builds: counter_fill.cu, the same
// counter_math.h) fills in place; every other device (XPU, MPS, a PrivateUse1 backend, CUDA when
// the layout has more dimensions than the kernel takes) is filled through the host: a chunk of at
// most kHostChunkBytes is generated on the CPU as the region it is of the op's output, then
// copied with the device's own copy_. Host memory stays bounded whatever the tensor's size, and
// the bits are the CPU fill's, since every element is a function of its global index alone.
constexpr int64_t kHostChunkBytes = int64_t{16} << 20;

void fill_through_host(const at::Tensor& out, const math::ElementParams& params,
                       c10::IntArrayRef global, const std::vector<int64_t>& start) {
  const int64_t bytes = out.numel() * static_cast<int64_t>(out.element_size());
  if (bytes <= kHostChunkBytes) {
    const at::Tensor host = at::empty(out.sizes(), out.options().device(c10::kCPU));
    fill_on_cpu(host, params, global, start);
    out.copy_(host);
    return;
  }
  // More than one chunk, so more than one element: split the first dimension longer than 1.
  int64_t d = 0;
  while (out.size(d) == 1) {
    ++d;
  }
  const int64_t slice_bytes = bytes / out.size(d);
  const int64_t step = std::max<int64_t>(1, kHostChunkBytes / slice_bytes);
  for (int64_t i = 0; i < out.size(d); i += step) {
    std::vector<int64_t> chunk_start = start;
    chunk_start[d] += i;
    fill_through_host(out.narrow(d, i, std::min(step, out.size(d) - i)), params, global,
                      chunk_start);
  }
}

// A complex output is its real view (Note [Counter RNG]).
void fill_complex(const at::Tensor& out, const CounterDistributionParams& params, uint64_t seed,
                  uint64_t stream, c10::IntArrayRef global, const std::vector<int64_t>& start) {
  TORCH_CHECK(params.distribution == CounterDistribution::kUniform ||
                  params.distribution == CounterDistribution::kNormal,
              "torchdefer: counter RNG fills a complex tensor (", out.scalar_type(), out.sizes(),
              ") only with a uniform or normal draw, as torch does; materialize it "
              "with rng=\"torch\", or draw its real and imaginary parts as real tensors.");
  CounterDistributionParams real = params;
  if (params.distribution == CounterDistribution::kNormal) {
    real.b = params.b / std::sqrt(2.0);
  }
  std::vector<int64_t> real_global(global.begin(), global.end());
  real_global.push_back(2);
  std::vector<int64_t> real_start = start;
  real_start.push_back(0);
  counter_fill(at::view_as_real(out), real, seed, stream, CounterRegion{real_global, real_start});
}

}  // namespace

void counter_fill(const at::Tensor& out, const CounterDistributionParams& params, uint64_t seed,
                  uint64_t stream, CounterRegion region) {
  const int64_t dims = out.dim();
  const c10::IntArrayRef global = region.global_sizes.empty() ? out.sizes() : region.global_sizes;
  TORCH_CHECK(static_cast<int64_t>(global.size()) == dims,
              "torchdefer: counter_fill: the region's ", "global shape ", global, " has ",
              global.size(), " dimensions but `out` ", out.sizes(), " has ", dims,
              "; give the op's whole output shape.");
  const std::vector<int64_t> start = region.start.empty()
                                         ? std::vector<int64_t>(static_cast<size_t>(dims), 0)
                                         : region.start.vec();
  TORCH_CHECK(static_cast<int64_t>(start.size()) == dims, "torchdefer: counter_fill: the region ",
              "starts at ", region.start, " but `out` ", out.sizes(), " has ", dims,
              " dimensions; give one start per dimension.");
  for (int64_t d = 0; d < dims; ++d) {
    TORCH_CHECK(start[d] >= 0 && start[d] + out.size(d) <= global[d],
                "torchdefer: counter_fill: `out` ", out.sizes(), " placed at ",
                c10::IntArrayRef(start), " does not fit in the global shape ", global,
                " along dimension ", d, ".");
  }
  if (out.numel() == 0) {
    return;
  }
  if (out.is_complex()) {
    fill_complex(out, params, seed, stream, global, start);
    return;
  }
  const math::ElementParams element = element_params(params, seed, stream);
  if (out.device().is_cpu()) {
    fill_on_cpu(out, element, global, start);
    return;
  }
#ifdef TORCHDEFER_WITH_CUDA
  if (out.device().is_cuda() && counter_fill_cuda(out, element, merge_rows(out, global, start))) {
    return;
  }
#endif
  fill_through_host(out, element, global, start);
}

}  // namespace torchdefer
