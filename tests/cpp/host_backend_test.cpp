// A minimal PrivateUse1 backend whose "device memory" the host cannot touch, registered by this
// test binary only, to check Note [Counter fill on other devices]: a device without a native
// counter kernel is filled through bounded host chunks and its own copy_, never by a host write
// into its memory, with the CPU fill's bits.
//
// The backend's memory is mapped PROT_NONE: any host read or write of it outside the backend's
// copy_ (which opens it for the copy, under a lock) is a SIGSEGV, which fails the test.
#include <torchdefer/counter_rng.h>
#include <torchdefer/torchdefer.h>

#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/strides.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <torch/library.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;

const c10::Device kDevice(c10::DeviceType::PrivateUse1, 0);

// Every live allocation, and what the backend's copies did.
struct HostBackend {
  std::mutex mutex;
  std::map<void*, size_t> allocations;
  std::atomic<int64_t> copies_in{0};  // host to device
  std::atomic<int64_t> bytes_in{0};
  std::atomic<int64_t> largest_copy_in{0};

  // Opens (or closes again) every allocation for the host, around one copy.
  void protect(int flags) {
    for (const auto& [pointer, size] : allocations) {
      mprotect(pointer, size, flags);
    }
  }
};

HostBackend& backend() {
  static HostBackend* instance = new HostBackend;
  return *instance;
}

size_t page_rounded(size_t bytes) {
  const size_t page = 4096;
  return std::max(page, (bytes + page - 1) / page * page);
}

void release(void* pointer) {
  const std::lock_guard<std::mutex> lock(backend().mutex);
  const auto it = backend().allocations.find(pointer);
  munmap(pointer, it->second);
  backend().allocations.erase(it);
}

class NoHostAccessAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    const size_t size = page_rounded(bytes);
    void* pointer = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(pointer != MAP_FAILED, "host backend: out of memory");
    const std::lock_guard<std::mutex> lock(backend().mutex);
    backend().allocations[pointer] = size;
    return {pointer, pointer, &release, kDevice};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "host backend: copy_data is not a device copy");
  }
};

NoHostAccessAllocator allocator;

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device>,
                               std::optional<bool>, std::optional<c10::MemoryFormat> format) {
  return at::detail::empty_generic(size, &allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                         std::optional<c10::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// The device tensor `t`, seen as a CPU tensor over the same memory (valid while it is open).
at::Tensor host_view(const at::Tensor& t) {
  if (t.device().is_cpu()) {
    return t;
  }
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
}

at::Tensor& copy(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  const std::lock_guard<std::mutex> lock(backend().mutex);
  backend().protect(PROT_READ | PROT_WRITE);
  host_view(self).copy_(host_view(src));
  backend().protect(PROT_NONE);
  if (self.device() == kDevice && src.device().is_cpu()) {
    const int64_t bytes = self.numel() * static_cast<int64_t>(self.element_size());
    ++backend().copies_in;
    backend().bytes_in += bytes;
    backend().largest_copy_in = std::max(backend().largest_copy_in.load(), bytes);
  }
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  copy(out, self, non_blocking);
  return out;
}

// What the commit of a materialization uses to point a tensor at new storage.
at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  const c10::DimVector contiguous = c10::contiguous_strides(size);
  self.unsafeGetTensorImpl()->set_sizes_and_strides(
      size, stride.empty() ? c10::IntArrayRef(contiguous) : stride, storage_offset);
  return self;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("set_.source_Storage_storage_offset", &set_storage);
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("copy_", &copy);
  m.impl("_copy_from", &copy_from);
}

// One device, always current.
class HostBackendGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device) const override { return kDevice; }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, HostBackendGuard);

at::Tensor to_cpu(const at::Tensor& device_tensor) {
  at::Tensor cpu = at::empty(device_tensor.sizes(), device_tensor.options().device(c10::kCPU));
  cpu.copy_(device_tensor);
  return cpu;
}

void reset_counts() {
  backend().copies_in = 0;
  backend().bytes_in = 0;
  backend().largest_copy_in = 0;
}

TEST(HostBackend, CounterFillHasTheCpuBitsAndOnlyCopiesIn) {
  const CounterDistributionParams normal{CounterDistribution::kNormal, 0.5, 2.0};
  for (c10::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    reset_counts();
    const at::Tensor on_device = at::empty({37, 129}, at::TensorOptions(dtype).device(kDevice));
    counter_fill(on_device, normal, 11, 5);
    const at::Tensor on_cpu = torch::empty({37, 129}, dtype);
    counter_fill(on_cpu, normal, 11, 5);
    EXPECT_TRUE(bitwise_equal(to_cpu(on_device), on_cpu)) << dtype;
    EXPECT_EQ(backend().copies_in.load(), 1) << dtype;
  }
}

TEST(HostBackend, LargeRegionsAreFilledInBoundedHostChunks) {
  // 40 MiB of float32, a region of a larger op output: every chunk is at most 16 MiB, and one
  // row (20 MiB) is split too.
  reset_counts();
  const std::vector<int64_t> global = {3, 6 << 20};
  const std::vector<int64_t> start = {1, 1 << 20};
  const at::Tensor on_device = at::empty({2, 5 << 20}, at::TensorOptions().device(kDevice));
  const CounterDistributionParams uniform{CounterDistribution::kUniform, -1.0, 1.0};
  counter_fill(on_device, uniform, 3, 9, {global, start});
  const at::Tensor on_cpu = torch::empty({2, 5 << 20});
  counter_fill(on_cpu, uniform, 3, 9, {global, start});
  EXPECT_TRUE(bitwise_equal(to_cpu(on_device), on_cpu));
  EXPECT_EQ(backend().bytes_in.load(), on_cpu.nbytes());
  EXPECT_LE(backend().largest_copy_in.load(), int64_t{16} << 20);
  EXPECT_GE(backend().copies_in.load(), 3);
}

TEST(HostBackend, NonContiguousDeviceOutputsGetTheirOwnElements) {
  const at::Tensor base = at::empty({64, 48}, at::TensorOptions().device(kDevice));
  const at::Tensor columns = base.as_strided({48, 64}, {1, 48});  // a transpose
  const CounterDistributionParams bernoulli{CounterDistribution::kBernoulli, 0.25};
  counter_fill(columns, bernoulli, 1, 2);
  const at::Tensor expected = torch::empty({48, 64});
  counter_fill(expected, bernoulli, 1, 2);
  EXPECT_TRUE(bitwise_equal(to_cpu(columns), expected));
}

TEST(HostBackend, MaterializesACounterModeModuleWithTheCpuBits) {
  const auto make = [] { return torch::nn::Linear(torch::nn::LinearOptions(96, 80)); };
  torch::manual_seed(5);  // the same seed for both recordings
  auto on_cpu = deferred_init(make);
  materialize_module(*on_cpu, MaterializeOptions().rng(RngMode::kCounter));
  torch::manual_seed(5);
  auto on_device = deferred_init(make);
  reset_counts();
  materialize_module(*on_device, MaterializeOptions().rng(RngMode::kCounter).device(kDevice));
  EXPECT_EQ(on_device->weight.device(), kDevice);
  EXPECT_TRUE(bitwise_equal(to_cpu(on_device->weight), on_cpu->weight));
  EXPECT_TRUE(bitwise_equal(to_cpu(on_device->bias), on_cpu->bias));
  EXPECT_GE(backend().copies_in.load(), 2);
}

// Note [Torch-mode draws run on the CPU]: eager construction's bits, drawn on the CPU and copied
// in.
TEST(HostBackend, TorchModeGivesEagersCpuBitsOnTheDevice) {
  const auto make = [] {
    auto linear = torch::nn::Linear(torch::nn::LinearOptions(96, 80));
    linear->weight.data().normal_(0.0, 0.02);
    linear->weight.data().slice(1, 0, 96, 3).uniform_(-1.0, 1.0);  // a strided view
    linear->weight.data().slice(1, 1, 96, 3).normal_(2.0, 1.0);
    return linear;
  };
  torch::manual_seed(8);
  auto eager = make();
  torch::manual_seed(8);
  auto deferred = deferred_init(make);
  materialize_module(*deferred, MaterializeOptions().device(kDevice));
  EXPECT_EQ(deferred->weight.device(), kDevice);
  EXPECT_TRUE(bitwise_equal(to_cpu(deferred->weight), eager->weight));
  EXPECT_TRUE(bitwise_equal(to_cpu(deferred->bias), eager->bias));
}

}  // namespace
}  // namespace torchdefer
