// Fake tensors and FakeMode: metadata, aliasing, version counters, autograd, errors.
#include <torchdefer/fake_tensor_impl.h>
#include <torchdefer/torchdefer.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include "core/src/stand_in_device_guard.h"

#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

namespace torchdefer {
namespace {

using testing::error_of;

using ::testing::HasSubstr;

const c10::StorageImpl* identity(const at::Tensor& t) {
  FakeTensorImpl* impl = fake_impl(t);
  return impl == nullptr ? nullptr : impl->storage_identity();
}

TEST(FakeMode, MakesEveryFactoryReturnAFakeWithRealMetadata) {
  FakeMode fake;
  const std::vector<at::Tensor> made = {
      torch::empty({4, 8}),
      torch::zeros({4, 8}),
      torch::ones({4, 8}, torch::kBFloat16),
      torch::full({4, 8}, 3.0),
      torch::randn({4, 8}),
      torch::rand({4, 8}),
      torch::randint(0, 10, {4, 8}),
      torch::arange(32).view({4, 8}),
      torch::linspace(0, 1, 32).view({4, 8}),
      torch::eye(4, 8),
      torch::empty_strided({4, 8}, {1, 4}),
  };
  for (const at::Tensor& t : made) {
    EXPECT_TRUE(is_fake(t)) << describe(t);
    EXPECT_EQ(t.sizes(), c10::IntArrayRef({4, 8}));
    EXPECT_EQ(t.device(), c10::Device(c10::kCPU));
  }
  EXPECT_EQ(made[2].scalar_type(), at::kBFloat16);
  EXPECT_EQ(made[6].scalar_type(), at::kLong);
  EXPECT_EQ(made[10].strides(), c10::IntArrayRef({1, 4}));
  EXPECT_FALSE(made[10].is_contiguous());
  EXPECT_EQ(made[0].nbytes(), 4u * 8u * 4u);
  EXPECT_EQ(made[2].nbytes(), 4u * 8u * 2u);
}

TEST(FakeMode, MakesTensorsFromHostDataFakeToo) {
  FakeMode fake;
  at::Tensor list = torch::tensor({1.0, 2.0, 3.0});
  at::Tensor scalar = torch::tensor(7, torch::kLong);
  EXPECT_TRUE(is_fake(list));
  EXPECT_EQ(list.sizes(), c10::IntArrayRef({3}));
  EXPECT_TRUE(is_fake(scalar));
  EXPECT_EQ(scalar.dim(), 0);
}

TEST(FakeMode, WithCudaGivesFakeCudaTensorsOnAMachineWithoutAGpu) {
  FakeMode fake(at::kCUDA);
  at::Tensor w = torch::empty({16, 32});
  EXPECT_TRUE(is_fake(w));
  EXPECT_TRUE(w.is_cuda());
  EXPECT_EQ(w.device(), c10::Device(c10::kCUDA, 0));
  at::Tensor explicit_device = torch::zeros({2}, torch::Device("cuda:3"));
  EXPECT_EQ(explicit_device.device(), c10::Device(c10::kCUDA, 3));
  at::Tensor on_cpu = torch::zeros({2}, torch::kCPU);
  EXPECT_EQ(on_cpu.device(), c10::Device(c10::kCPU));
  at::Tensor y = torch::matmul(w.t(), torch::randn({16, 4}));
  EXPECT_TRUE(is_fake(y));
  EXPECT_EQ(y.device(), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(y.sizes(), c10::IntArrayRef({32, 4}));
  at::Tensor moved = y.to(torch::kCPU, torch::kHalf);
  EXPECT_EQ(moved.device(), c10::Device(c10::kCPU));
  EXPECT_EQ(moved.scalar_type(), at::kHalf);
  EXPECT_TRUE(is_fake(moved));
}

TEST(FakeMode, NeverInitializesCuda) {
  const bool cuda = at::detail::getCUDAHooks().hasCUDA();
  // Asked after each step, so that a GPU run names the step that created a context.
  const auto expect_no_context = [&](const char* after) {
    if (cuda) {
      EXPECT_FALSE(at::detail::getCUDAHooks().hasPrimaryContext(0)) << "after " << after;
    }
  };
  {
    FakeMode fake(at::kCUDA);
    expect_no_context("entering FakeMode(kCUDA)");
    torch::nn::Linear linear(64, 64);
    expect_no_context("constructing nn::Linear (empty, kaiming_uniform_, uniform_)");
    at::Tensor x = torch::randn({2, 64});
    expect_no_context("torch::randn");
    at::Tensor out = linear(x);
    expect_no_context("the forward pass (addmm, autograd's graph)");
    EXPECT_TRUE(out.requires_grad());
  }
  if (cuda) {
    expect_no_context("leaving FakeMode");
  } else {
    // A CPU-only LibTorch has no CUDA backend: the only CUDA device guard is torchdefer's
    // stand-in (Note [Stand-in device guards]), and CUDA itself cannot have been touched.
    EXPECT_TRUE(detail::has_stand_in_device_guard(c10::kCUDA));
  }
}

TEST(FakeMode, NestsAndRestoresTheEnclosingDefaultDevice) {
  EXPECT_FALSE(FakeMode::is_active());
  {
    FakeMode outer(at::kCUDA);
    {
      FakeMode inner(c10::Device(c10::kCUDA, 1));
      EXPECT_EQ(torch::empty({1}).device(), c10::Device(c10::kCUDA, 1));
      FakeMode keeps_device;
      EXPECT_EQ(torch::empty({1}).device(), c10::Device(c10::kCUDA, 1));
    }
    EXPECT_EQ(torch::empty({1}).device(), c10::Device(c10::kCUDA, 0));
    EXPECT_TRUE(FakeMode::is_active());
  }
  EXPECT_FALSE(FakeMode::is_active());
  EXPECT_FALSE(FakeMode::default_device().has_value());
  EXPECT_FALSE(is_fake(torch::empty({1})));
}

TEST(FakeMode, LeavesNothingBehindWhenConstructionThrows) {
  auto build = [] {
    FakeMode fake(at::kCUDA);
    torch::nn::Linear linear(4, 4);
    throw std::runtime_error("constructor failed");
  };
  EXPECT_THROW(build(), std::runtime_error);
  EXPECT_FALSE(FakeMode::is_active());
  EXPECT_FALSE(FakeMode::default_device().has_value());
  EXPECT_FALSE(is_fake(torch::ones({2})));
}

TEST(FakeMode, IsThreadLocal) {
  FakeMode fake;
  bool other_thread_fake = true;
  std::thread other([&] { other_thread_fake = is_fake(torch::empty({2})); });
  other.join();
  EXPECT_FALSE(other_thread_fake);
  EXPECT_TRUE(is_fake(torch::empty({2})));
}

TEST(FakeMode, RejectsTheMetaDevice) {
  EXPECT_THAT(error_of([] { FakeMode fake(at::kMeta); }), HasSubstr("not meta"));
  EXPECT_FALSE(FakeMode::is_active());
}

TEST(FakeMode, LetsOpsOnRealTensorsComputeForReal) {
  at::Tensor a = torch::ones({3});
  FakeMode fake;
  at::Tensor sum = a + a;
  EXPECT_FALSE(is_fake(sum));
  EXPECT_EQ(sum[1].item<float>(), 2.0f);
  a.mul_(4);
  EXPECT_EQ(a[0].item<float>(), 4.0f);
}

TEST(FakeTensor, StaysFakeThroughOpsOutsideFakeMode) {
  at::Tensor w;
  {
    FakeMode fake(at::kCUDA);
    w = torch::empty({8, 4});
  }
  at::Tensor y = (w * 2 + 1).relu().sum(1);
  EXPECT_TRUE(is_fake(y));
  EXPECT_EQ(y.sizes(), c10::IntArrayRef({8}));
  EXPECT_EQ(y.device(), c10::Device(c10::kCUDA, 0));
  std::vector<at::Tensor> chunks = w.chunk(3, 0);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].sizes(), c10::IntArrayRef({2, 4}));
  EXPECT_TRUE(is_fake(chunks[2]));
}

TEST(FakeTensor, ViewsShareTheBaseStorageIdentity) {
  FakeMode fake;
  at::Tensor base = torch::empty({4, 6});
  const std::vector<at::Tensor> views = {base.t(),
                                         base.transpose(0, 1),
                                         base.narrow(1, 2, 3),
                                         base.select(0, 1),
                                         base.slice(1, 0, 6, 2),
                                         base.view({24}),
                                         base.reshape({6, 4}),
                                         base.flatten(),
                                         base.unsqueeze(0),
                                         base[0].expand({3, 6}),
                                         base.detach(),
                                         base.split(2, 0)[1],
                                         base.permute({1, 0}),
                                         base.alias()};
  for (const at::Tensor& v : views) {
    EXPECT_TRUE(is_fake(v));
    EXPECT_EQ(identity(v), identity(base)) << describe(v);
  }
  EXPECT_EQ(base.narrow(1, 2, 3).storage_offset(), 2);
  EXPECT_EQ(base.t().strides(), c10::IntArrayRef({1, 6}));
  EXPECT_NE(identity(base.clone()), identity(base));
  EXPECT_NE(identity(base.t().contiguous()), identity(base));
  EXPECT_NE(identity(torch::empty({4, 6})), identity(base));
}

TEST(FakeTensor, InPlaceOpsReturnTheSameTensorAndBumpVersionsThroughViews) {
  FakeMode fake;
  at::Tensor base = torch::empty({4, 6});
  at::Tensor view = base.narrow(1, 0, 3);
  const int64_t before = base._version();
  at::Tensor& result = view.normal_();
  EXPECT_TRUE(result.is_same(view));
  EXPECT_EQ(view._version(), before + 1);
  EXPECT_EQ(base._version(), before + 1);
  base.t().uniform_(-1, 1);
  EXPECT_EQ(base._version(), before + 2);
  at::Tensor& filled = base.fill_(2);
  EXPECT_TRUE(filled.is_same(base));
  EXPECT_EQ(view._version(), before + 3);
}

TEST(FakeTensor, InPlaceResizeUpdatesTheMetadata) {
  FakeMode fake;
  at::Tensor t = torch::empty({2, 3});
  t.resize_({5, 7});
  EXPECT_EQ(t.sizes(), c10::IntArrayRef({5, 7}));
  EXPECT_EQ(t.numel(), 35);
  EXPECT_EQ(fake_impl(t)->meta().sizes(), t.sizes());
  EXPECT_THAT(error_of([&] { return t.data_ptr(); }), HasSubstr("[5, 7]"));
}

TEST(FakeTensor, CarriesAutogradMetadataLikeARealTensor) {
  FakeMode fake;
  at::Tensor w = torch::empty({4, 4}, torch::requires_grad());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  at::Tensor y = w.mm(torch::ones({4, 2}));
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "MmBackward0");
  at::Tensor v = w.view({16});
  EXPECT_TRUE(v.is_view());
  EXPECT_TRUE(v._base().is_same(w));
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE((w * 2).requires_grad());
  }
  y.sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(is_fake(w.grad()));
  EXPECT_EQ(w.grad().sizes(), w.sizes());
}

TEST(FakeTensor, DetachedCopiesAndSetDataKeepAliasingRules) {
  FakeMode fake;
  at::Tensor w = torch::empty({3, 3}, torch::requires_grad());
  at::Tensor data = w.variable_data();
  EXPECT_TRUE(is_fake(data));
  EXPECT_EQ(identity(data), identity(w));
  data.resize_({9});
  EXPECT_EQ(w.sizes(), c10::IntArrayRef({3, 3}));

  at::Tensor other = torch::empty({2, 5}, torch::kDouble);
  w.set_data(other);
  EXPECT_EQ(w.sizes(), c10::IntArrayRef({2, 5}));
  EXPECT_EQ(w.scalar_type(), at::kDouble);
  EXPECT_EQ(identity(w), identity(other));
  EXPECT_TRUE(w.requires_grad());
}

TEST(FakeTensor, TurnsRealInPlaceWhenGivenRealData) {
  at::Tensor w;
  {
    FakeMode fake;
    w = torch::empty({2, 2});
  }
  const c10::TensorImpl* impl = w.unsafeGetTensorImpl();
  at::Tensor alias = w;
  w.set_data(torch::full({2, 2}, 5.0));
  EXPECT_FALSE(is_fake(alias));
  EXPECT_EQ(alias.unsafeGetTensorImpl(), impl);
  EXPECT_EQ(alias.sum().item<float>(), 20.0f);
  at::Tensor detached = alias.detach();
  EXPECT_FALSE(is_fake(detached));
  EXPECT_EQ(detached.data_ptr(), alias.data_ptr());
}

TEST(FakeTensor, RunsAForwardPassToTheRightShape) {
  FakeMode fake(at::kCUDA);
  torch::nn::Sequential mlp(torch::nn::Linear(32, 128), torch::nn::GELU(),
                            torch::nn::Linear(128, 10));
  at::Tensor logits = mlp->forward(torch::randn({5, 32}));
  EXPECT_TRUE(is_fake(logits));
  EXPECT_EQ(logits.sizes(), c10::IntArrayRef({5, 10}));
  EXPECT_EQ(logits.device(), c10::Device(c10::kCUDA, 0));
  at::Tensor probabilities = torch::softmax(logits, -1);
  EXPECT_EQ(probabilities.sizes(), logits.sizes());
}

TEST(FakeTensor, MixesWithCpuScalarsLikeARealTensor) {
  FakeMode fake(at::kCUDA);
  at::Tensor w = torch::empty({4});
  at::Tensor scalar;
  {
    FakeMode cpu_fake(at::kCPU);
    scalar = torch::tensor(2.0);
  }
  at::Tensor y = w * scalar;
  EXPECT_EQ(y.device(), c10::Device(c10::kCUDA, 0));
  at::Tensor real_scalar = at::scalar_tensor(3.0);
  EXPECT_EQ((w + real_scalar).device(), c10::Device(c10::kCUDA, 0));
}

TEST(FakeTensor, PromotesWithWrappedNumbersLikeARealTensor) {
  // Python numbers and NumPy scalars reach ops as 0-dim CPU "wrapped numbers", which promote like
  // Python scalars: int64 * wrapped float64 is float32, not float64.
  at::Tensor wrapped = at::scalar_tensor(2.5, at::kDouble);
  wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
  const at::Tensor real = torch::arange(4) * wrapped;
  FakeMode fake(at::kCUDA);
  const at::Tensor product = torch::arange(4) * wrapped;
  EXPECT_TRUE(is_fake(product));
  EXPECT_EQ(product.scalar_type(), real.scalar_type());
  EXPECT_EQ(product.scalar_type(), at::kFloat);
  EXPECT_EQ(product.device(), c10::Device(c10::kCUDA, 0));
}

TEST(FakeTensor, IsDescribedWithoutTouchingData) {
  FakeMode fake(at::kCUDA);
  at::Tensor w = torch::empty({3, 4}, torch::kBFloat16);
  EXPECT_EQ(describe(w), "fake BFloat16[3, 4] on cuda:0");
  EXPECT_EQ(describe(w.t()), "fake BFloat16[4, 3] on cuda:0");
  EXPECT_EQ(describe(at::Tensor()), "undefined tensor");
}

TEST(FakeTensorErrors, StreamingValuesSaysTheTensorIsFake) {
  // at::print always reads values; it gets the fake-tensor error, not a crash or garbage.
  FakeMode fake(at::kCUDA);
  at::Tensor w = torch::empty({3, 4});
  std::ostringstream printed;
  const std::string message = error_of([&] { printed << w; });
  EXPECT_THAT(message, HasSubstr("fake tensor has shape, dtype and device"));
  EXPECT_THAT(message, HasSubstr("torchdefer::describe(t)"));
}

TEST(FakeTensorErrors, DataPtrNamesTheTensorAndSaysToMaterialize) {
  FakeMode fake(at::kCUDA);
  at::Tensor w = torch::empty({4, 4});
  const std::string message = error_of([&] { return w.data_ptr(); });
  EXPECT_THAT(message, HasSubstr("fake Float[4, 4] on cuda:0"));
  EXPECT_THAT(message, HasSubstr("no storage"));
  EXPECT_THAT(message, HasSubstr("Materialize"));
  EXPECT_THAT(error_of([&] { return w.data_ptr<float>(); }), HasSubstr("fake Float[4, 4]"));
}

TEST(FakeTensorErrors, StorageNamesTheTensor) {
  FakeMode fake;
  at::Tensor w = torch::empty({2, 3});
  EXPECT_THAT(error_of([&] { return w.storage(); }), HasSubstr("fake Float[2, 3] on cpu"));
}

TEST(FakeTensorErrors, ItemNamesTheOpAndTheTensor) {
  FakeMode fake(at::kCUDA);
  at::Tensor w = torch::empty({});
  const std::string message = error_of([&] { return w.item<float>(); });
  EXPECT_THAT(message, HasSubstr("item()"));
  EXPECT_THAT(message, HasSubstr("fake Float[] on cuda:0"));
  EXPECT_THAT(message, HasSubstr("materialize"));
}

TEST(FakeTensorErrors, DataDependentOpsNameTheOp) {
  FakeMode fake;
  at::Tensor w = torch::empty({5});
  EXPECT_THAT(error_of([&] { return w.nonzero(); }), HasSubstr("aten::nonzero"));
  EXPECT_THAT(error_of([&] { return torch::equal(w, w.clone()); }), HasSubstr("aten::equal"));
  EXPECT_THAT(error_of([&] { return torch::masked_select(w, w > 0); }),
              HasSubstr("aten::masked_select"));
}

TEST(FakeTensor, EqualsItselfWithoutReadingData) {
  // ATen's equal() answers true for the same view of the same storage without reading it; the
  // C++ MultiheadAttention relies on that to detect self-attention.
  FakeMode fake;
  at::Tensor w = torch::empty({5});
  EXPECT_TRUE(torch::equal(w, w));
  EXPECT_TRUE(torch::equal(w, w.view({5})));
}

TEST(FakeTensorErrors, MixingDevicesRaisesTheErrorARealTensorRaises) {
  FakeMode fake(at::kCUDA);
  at::Tensor on_cuda = torch::empty({4});
  at::Tensor on_cpu = torch::empty({4}, torch::kCPU);
  const std::string message = error_of([&] { return on_cuda + on_cpu; });
  EXPECT_THAT(message, HasSubstr("Expected all tensors to be on the same device"));
  EXPECT_THAT(message, HasSubstr("cuda:0 and cpu"));
  EXPECT_THAT(error_of([&] {
                return torch::mm(on_cuda.view({2, 2}), torch::ones({2, 2}, at::kCPU));
              }),
              HasSubstr("Expected all tensors to be on the same device"));
  on_cuda.copy_(on_cpu);
}

TEST(FakeTensorErrors, WritingFakeValuesIntoARealTensorIsRefused) {
  at::Tensor real = torch::ones({3});
  at::Tensor fake_value;
  {
    FakeMode fake;
    fake_value = torch::empty({3});
  }
  const std::string message = error_of([&] { return real.add_(fake_value); });
  EXPECT_THAT(message, HasSubstr("aten::add_"));
  EXPECT_THAT(message, HasSubstr("real tensor 'self'"));
  EXPECT_EQ(real.sum().item<float>(), 3.0f);
}

TEST(FakeTensorErrors, OpWithoutAMetaKernelIsNamed) {
  FakeMode fake;
  at::Tensor w = torch::empty({4, 4});
  const std::string message = error_of([&] { return torch::_fft_r2c(w, {1}, 0, true); });
  EXPECT_THAT(message, HasSubstr("no meta kernel"));
  EXPECT_THAT(message, HasSubstr("aten::_fft_r2c"));
}

TEST(FakeTensorErrors, ShapeErrorsAreTheRealKernelsErrors) {
  FakeMode fake;
  const std::string message = error_of([] {
    return torch::mm(torch::empty({2, 3}), torch::empty({4, 5}));
  });
  EXPECT_THAT(message, HasSubstr("cannot be multiplied"));
}

// Note [The access error of a fake]: the message is written when an access fails, not when the
// fake is made; it is the same message, naming the fake's shape at the time of the access.
TEST(FakeTensorErrors, DataAndStorageAccessThrowTheWholeMessage) {
  FakeMode fake(at::kCUDA);
  at::Tensor w = torch::empty({4, 4});
  const std::string expected =
      "Cannot access the data or storage of fake Float[4, 4] on cuda:0: a fake tensor has shape, "
      "dtype and device but no storage. Materialize it before reading its data (data_ptr, item, "
      "storage, printing values); to print what it is, use torchdefer::describe(t) (Python: "
      "torchdefer.describe(t)).";
  EXPECT_THAT(error_of([&] { return w.storage(); }), ::testing::StartsWith(expected));
  EXPECT_THAT(error_of([&] { return w.data_ptr(); }), ::testing::StartsWith(expected));
  EXPECT_THAT(error_of([&] { return w.const_data_ptr(); }), ::testing::StartsWith(expected));
  EXPECT_FALSE(w.has_storage());
}

TEST(FakeTensorErrors, AnAccessAfterAResizeNamesTheNewShape) {
  FakeMode fake;
  at::Tensor t = torch::empty({2, 3});
  EXPECT_THAT(error_of([&] { return t.data_ptr(); }), HasSubstr("fake Float[2, 3] on cpu"));
  t.resize_({5, 7});
  EXPECT_THAT(error_of([&] { return t.data_ptr(); }), HasSubstr("fake Float[5, 7] on cpu"));
  EXPECT_THAT(error_of([&] { return t.storage(); }), HasSubstr("fake Float[5, 7] on cpu"));
}

TEST(FakeTensorErrors, DetachedCopiesAndViewsNameTheirOwnShape) {
  FakeMode fake;
  at::Tensor t = torch::empty({2, 3});
  EXPECT_THAT(error_of([&] { return t.data_ptr(); }), HasSubstr("fake Float[2, 3]"));
  at::Tensor detached = t.detach();
  detached.resize_({4});
  EXPECT_THAT(error_of([&] { return detached.data_ptr(); }), HasSubstr("fake Float[4] on cpu"));
  EXPECT_THAT(error_of([&] { return t.data_ptr(); }), HasSubstr("fake Float[2, 3] on cpu"));
  EXPECT_THAT(error_of([&] { return t[1].storage(); }), HasSubstr("fake Float[3] on cpu"));
}

}  // namespace
}  // namespace torchdefer
