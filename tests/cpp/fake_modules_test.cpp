// torch::nn modules built under FakeMode have the parameters and buffers eager construction gives
// (names, shapes, dtypes, requires_grad), on the fake device, and run forward passes on fakes.
#include <torchdefer/torchdefer.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "bench/models/llama.h"

#include <functional>
#include <memory>
#include <string>

namespace torchdefer {
namespace {

namespace nn = torch::nn;

struct ModuleCase {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make;
  // Runs a forward pass on inputs created in the current (fake) mode; returns the main output.
  std::function<at::Tensor(nn::Module&)> forward;
  std::vector<int64_t> output_shape;
};

void PrintTo(const ModuleCase& module_case, std::ostream* out) { *out << module_case.name; }

template <typename Impl>
Impl& as(nn::Module& m) {
  return dynamic_cast<Impl&>(m);
}

std::vector<ModuleCase> module_cases() {
  return {
      {"Linear",
       [] { return nn::Linear(64, 32).ptr(); },
       [](nn::Module& m) {
         return as<nn::LinearImpl>(m).forward(torch::randn({8, 64}));
       },
       {8, 32}},
      {"Conv2d",
       [] { return nn::Conv2d(nn::Conv2dOptions(3, 16, 3).stride(2).padding(1)).ptr(); },
       [](nn::Module& m) {
         return as<nn::Conv2dImpl>(m).forward(torch::randn({2, 3, 32, 32}));
       },
       {2, 16, 16, 16}},
      {"Embedding",
       [] { return nn::Embedding(1000, 48).ptr(); },
       [](nn::Module& m) {
         return as<nn::EmbeddingImpl>(m).forward(torch::randint(0, 1000, {4, 7}));
       },
       {4, 7, 48}},
      {"LayerNorm",
       [] { return nn::LayerNorm(nn::LayerNormOptions({48})).ptr(); },
       [](nn::Module& m) {
         return as<nn::LayerNormImpl>(m).forward(torch::randn({4, 7, 48}));
       },
       {4, 7, 48}},
      {"BatchNorm2d",
       [] { return nn::BatchNorm2d(16).ptr(); },
       [](nn::Module& m) {
         return as<nn::BatchNorm2dImpl>(m).forward(torch::randn({2, 16, 5, 5}));
       },
       {2, 16, 5, 5}},
      {"MultiheadAttention",
       [] { return nn::MultiheadAttention(64, 8).ptr(); },
       [](nn::Module& m) {
         at::Tensor x = torch::randn({10, 2, 64});
         return std::get<0>(as<nn::MultiheadAttentionImpl>(m).forward(x, x, x));
       },
       {10, 2, 64}},
      {"TransformerEncoderLayer",
       [] { return nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(64, 4)).ptr(); },
       [](nn::Module& m) {
         return as<nn::TransformerEncoderLayerImpl>(m).forward(torch::randn({10, 2, 64}));
       },
       {10, 2, 64}},
      {"LSTM",
       [] { return nn::LSTM(nn::LSTMOptions(32, 64).num_layers(2)).ptr(); },
       [](nn::Module& m) {
         return std::get<0>(as<nn::LSTMImpl>(m).forward(torch::randn({5, 3, 32})));
       },
       {5, 3, 64}},
      {"Llama",
       [] { return models::Llama(models::LlamaConfig::named("tiny")).ptr(); },
       [](nn::Module& m) {
         return as<models::LlamaImpl>(m).forward(torch::randint(0, 256, {2, 16}));
       },
       {2, 16, 256}},
  };
}

class FakeModule : public ::testing::TestWithParam<std::tuple<ModuleCase, c10::Device>> {};

void expect_same_tensors(const torch::OrderedDict<std::string, at::Tensor>& fake,
                         const torch::OrderedDict<std::string, at::Tensor>& eager,
                         c10::Device device) {
  ASSERT_EQ(fake.keys(), eager.keys());
  for (const auto& item : eager) {
    const at::Tensor& f = fake[item.key()];
    const at::Tensor& e = item.value();
    EXPECT_TRUE(is_fake(f)) << item.key();
    EXPECT_EQ(f.sizes(), e.sizes()) << item.key();
    EXPECT_EQ(f.strides(), e.strides()) << item.key();
    EXPECT_EQ(f.scalar_type(), e.scalar_type()) << item.key();
    EXPECT_EQ(f.requires_grad(), e.requires_grad()) << item.key();
    EXPECT_EQ(f.device(), device) << item.key();
  }
}

TEST_P(FakeModule, HasTheParametersAndBuffersOfEagerConstruction) {
  const auto& [module_case, device] = GetParam();
  std::shared_ptr<nn::Module> eager = module_case.make();
  std::shared_ptr<nn::Module> fake;
  {
    FakeMode mode(device);
    fake = module_case.make();
  }
  expect_same_tensors(fake->named_parameters(), eager->named_parameters(), device);
  expect_same_tensors(fake->named_buffers(), eager->named_buffers(), device);
}

TEST_P(FakeModule, RunsAForwardPassToTheEagerShape) {
  const auto& [module_case, device] = GetParam();
  FakeMode mode(device);
  std::shared_ptr<nn::Module> fake = module_case.make();
  at::Tensor output = module_case.forward(*fake);
  EXPECT_TRUE(is_fake(output));
  EXPECT_EQ(output.sizes(), c10::IntArrayRef(module_case.output_shape));
  EXPECT_EQ(output.device(), device);
}

INSTANTIATE_TEST_SUITE_P(TorchNn, FakeModule,
                         ::testing::Combine(::testing::ValuesIn(module_cases()),
                                            ::testing::Values(c10::Device(c10::kCPU),
                                                              c10::Device(c10::kCUDA, 0))),
                         [](const auto& info) {
                           return std::get<0>(info.param).name +
                                  (std::get<1>(info.param).is_cuda() ? "OnFakeCuda" : "OnFakeCpu");
                         });

// What batch_norm calls on CUDA where cuDNN is built in (a GPU machine's LibTorch): the rule in
// the op table shapes it as cuDNN does, output like the input, the saved statistics per channel
// while training (empty otherwise) in float, and the reserve space, which batch_norm drops,
// empty.
TEST(FakeCudnn, BatchNormHasCudnnsShapesOnFakeCuda) {
  FakeMode mode(at::kCUDA);
  const at::Tensor x = torch::empty({2, 16, 5, 5}, at::kHalf);
  const at::Tensor weight = torch::ones({16});
  const at::Tensor bias = torch::zeros({16});
  const at::Tensor mean = torch::zeros({16});
  const at::Tensor var = torch::ones({16});
  for (const bool training : {true, false}) {
    const auto [out, save_mean, save_var, reserve] =
        at::cudnn_batch_norm(x, weight, bias, mean, var, training, 0.1, 1e-5);
    for (const at::Tensor& t : {out, save_mean, save_var, reserve}) {
      EXPECT_TRUE(is_fake(t));
      EXPECT_EQ(t.device(), c10::Device(c10::kCUDA, 0));
    }
    EXPECT_EQ(out.sizes(), x.sizes());
    EXPECT_EQ(out.scalar_type(), at::kHalf);
    const int64_t stats = training ? 16 : 0;
    EXPECT_EQ(save_mean.sizes(), c10::IntArrayRef({stats})) << training;
    EXPECT_EQ(save_var.sizes(), c10::IntArrayRef({stats})) << training;
    EXPECT_EQ(save_mean.scalar_type(), at::kFloat);
    EXPECT_EQ(reserve.numel(), 0);
    EXPECT_EQ(reserve.scalar_type(), at::kByte);
  }
}

TEST(FakeLlama, The70BShapeHasTheExpectedParameterCountAndNoStorage) {
  const models::LlamaConfig config = models::LlamaConfig::named("llama3-70b");
  FakeMode mode(at::kCUDA);
  models::Llama model(config);
  int64_t parameters = 0;
  for (const at::Tensor& p : model->parameters()) {
    ASSERT_TRUE(is_fake(p));
    parameters += p.numel();
  }
  EXPECT_EQ(parameters, config.parameter_count());
  EXPECT_EQ(parameters, 70553706496);
}

}  // namespace
}  // namespace torchdefer
