// Sharded materialization: every rank computes its slice alone, and for any world size the
// slices concatenate to exactly the full counter-mode tensor.
#include <torchdefer/extension.h>
#include <torchdefer/torchdefer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include "bench/models/llama.h"

#include <functional>
#include <string>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;
using testing::error_of;

namespace nn = torch::nn;
using ::testing::HasSubstr;

TEST(Shard, FollowsTorchChunk) {
  auto rows = [](int64_t rank, int64_t world, int64_t size) {
    const Box box = *Shard{rank, world}.box_for({size, 3});
    return std::make_pair(box.start[0], box.stop[0]);
  };
  EXPECT_EQ(rows(0, 4, 10), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(rows(3, 4, 10), std::make_pair(int64_t{9}, int64_t{10}));
  EXPECT_EQ(rows(9, 16, 10), std::make_pair(int64_t{9}, int64_t{10}));
  EXPECT_EQ(rows(12, 16, 10), std::make_pair(int64_t{10}, int64_t{10}));  // empty
  EXPECT_FALSE(Shard({0, 2, 1}).box_for({7}).has_value());                // replicated
  EXPECT_THAT(error_of([] { Shard{4, 4}.box_for({8}); }), HasSubstr("rank=4"));
}

struct ShardedModel {
  std::string name;
  std::function<std::shared_ptr<nn::Module>()> make;
};

struct EmbeddingAndCastsImpl : nn::Module {
  EmbeddingAndCastsImpl() {
    table = register_parameter("table", torch::empty({13, 10}));
    torch::NoGradGuard no_grad;
    table.normal_(0, 0.5);
    table.narrow(1, 2, 5).uniform_(-1, 1);
    table.t()[7].fill_(3.0);
    table.mul_(2).add_(1).clamp_(-2, 2);
    scaled = register_parameter("scaled", (torch::rand({9, 6}) * 4).to(torch::kBFloat16));
    bias = register_parameter("bias", torch::zeros({11}));
  }
  at::Tensor table, scaled, bias;
};
TORCH_MODULE(EmbeddingAndCasts);

// Writes through single elements and views of views (Note [Views that miss the region]), and
// views that are no box of their base (diagonal, unfold, odd as_strided), which fall back.
struct ElementWritesImpl : nn::Module {
  ElementWritesImpl() {
    rows = register_parameter("rows", torch::randn({8, 6}));
    bias = register_parameter("bias", torch::randn({12}));
    flat = register_parameter("flat", torch::randn({5, 4}));
    dirac = register_parameter("dirac", torch::empty({6, 3, 3}));
    nested = register_parameter("nested", torch::randn({7, 5}));
    strided = register_parameter("strided", torch::randn({6, 6}));
    indexed = register_parameter("indexed", torch::randn({7, 4}));
    torch::NoGradGuard no_grad;
    rows[5].zero_();
    rows[-1].fill_(3.0);
    rows.select(1, 4).fill_(2.0);
    rows.select(1, -1)[-2].random_(7);
    bias[8].random_(51);
    bias[-1].normal_();
    flat.reshape(-1)[1].geometric_(0.1);
    nn::init::dirac_(dirac);
    nested.narrow(0, 1, 5).t()[2][3].fill_(7.0);
    nested.t()[1].narrow(0, 2, 3).mul_(2);
    nested.t().narrow(0, 3, 2)[1][-1].uniform_(-1, 1);
    strided.as_strided({2, 3}, {6, 1}, 7).fill_(3.0);
    strided.diagonal().fill_(1.0);
    strided.unfold(0, 2, 2).select(2, 1).add_(1.0);
    indexed.index_fill_(0, torch::tensor({1, 5}), 1.5);
    indexed.index_put_({torch::tensor({2, -1})}, torch::tensor(0.25));
  }
  at::Tensor rows, bias, flat, dirac, nested, strided, indexed;
};
TORCH_MODULE(ElementWrites);

// Tensors made by cat and stack, and slices of tensors (Note [Region rules for cat and stack]).
struct JoinedImpl : nn::Module {
  JoinedImpl() {
    q = register_module("q", nn::Linear(8, 4));
    k = register_module("k", nn::Linear(8, 4));
    v = register_module("v", nn::Linear(8, 4));
    qkv = register_parameter("qkv", torch::cat({q->weight, k->weight, v->weight}));
    columns = register_parameter(
        "columns",
        torch::cat({torch::randn({5, 3}), torch::zeros({5, 2}), torch::rand({5, 4})}, 1));
    promoted = register_parameter(
        "promoted", torch::cat({torch::rand({2, 3}), torch::randn({3, 3}, torch::kDouble)}, -2));
    stacked =
        register_parameter("stacked", torch::stack({torch::randn({4, 3}), torch::ones({4, 3})}, 1));
    layered =
        register_parameter("layered", torch::stack({torch::rand({3, 5}), torch::randn({3, 5})}));
    fused = register_parameter("fused", torch::empty({12, 8}));
    const at::Tensor source = torch::randn({12, 6});
    pieces = register_parameter(
        "pieces", torch::cat({source.split(4)[1], source.chunk(3, 1)[2].t().t().narrow(0, 0, 4),
                              source.unbind(1)[3].unsqueeze(1).narrow(0, 8, 4),
                              source.split_with_sizes({2, 4, 6})[2].narrow(0, 0, 4)},
                             1));
    torch::NoGradGuard no_grad;
    qkv.narrow(0, 2, 5).mul_(0.5);
    nn::init::normal_(fused.narrow(0, 0, 4), 0, 0.02);
    nn::init::kaiming_uniform_(fused.narrow(0, 4, 4));
    nn::init::zeros_(fused.narrow(0, 8, 4));
  }
  nn::Linear q{nullptr}, k{nullptr}, v{nullptr};
  at::Tensor qkv, columns, promoted, stacked, layered, fused, pieces;
};
TORCH_MODULE(Joined);

std::vector<ShardedModel> sharded_models() {
  return {
      {"Llama", [] { return models::Llama(models::LlamaConfig::named("tiny")).ptr(); }},
      {"LinearAndLayerNorm",
       [] {
         return nn::Sequential(nn::Linear(12, 7), nn::LayerNorm(nn::LayerNormOptions({7}))).ptr();
       }},
      {"WritesThroughViewsAndCasts", [] { return EmbeddingAndCasts().ptr(); }},
      {"ElementWrites", [] { return ElementWrites().ptr(); }},
      {"CatAndStack", [] { return Joined().ptr(); }},
  };
}

class ShardInvariance : public ::testing::TestWithParam<ShardedModel> {};

// Each rank records on its own, as separate processes would, from the same seed.
std::shared_ptr<nn::Module> record(const ShardedModel& model) {
  torch::manual_seed(2026);
  return deferred_init(model.make);
}

TEST_P(ShardInvariance, ShardsOfEveryWorldSizeConcatenateToTheFullCounterTensor) {
  std::shared_ptr<nn::Module> full = record(GetParam());
  materialize_module(*full, MaterializeOptions().rng(RngMode::kCounter));
  const auto full_parameters = full->named_parameters();
  const auto full_buffers = full->named_buffers();
  for (const int64_t dim : {0, 1}) {
    for (const int64_t world : {1, 2, 3, 4, 7, 8, 16}) {
      std::map<std::string, std::vector<at::Tensor>> pieces;
      for (int64_t rank = 0; rank < world; ++rank) {
        std::shared_ptr<nn::Module> local = record(GetParam());
        materialize_module(*local, MaterializeOptions().shard({rank, world, dim}));
        for (const auto& p : local->named_parameters()) {
          ASSERT_FALSE(is_fake(p.value())) << p.key();
          pieces[p.key()].push_back(p.value());
          const std::optional<ShardInfo> info = shard_info(p.value());
          if (p.value().dim() > dim && world > 1) {
            ASSERT_TRUE(info.has_value()) << p.key();
            EXPECT_EQ(info->global_sizes, full_parameters[p.key()].sizes().vec());
          }
        }
        for (const auto& b : local->named_buffers()) {
          EXPECT_TRUE(bitwise_equal(b.value(), full_buffers[b.key()])) << b.key();
        }
      }
      for (const auto& [name, parts] : pieces) {
        const at::Tensor& expected = full_parameters[name];
        const at::Tensor joined = expected.dim() > dim ? torch::cat(parts, dim) : parts.front();
        EXPECT_TRUE(bitwise_equal(joined, expected))
            << name << " dim " << dim << " world " << world;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ShardInvariance, ::testing::ValuesIn(sharded_models()),
                         [](const auto& info) { return info.param.name; });

TEST(ShardedMaterialization, ComputesOnlyTheSliceAndReportsIt) {
  torch::manual_seed(1);
  auto model = deferred_init([] { return models::Llama(models::LlamaConfig::named("tiny")); });
  const MaterializeStats stats = materialize_module(*model, MaterializeOptions().shard({1, 4}));
  ASSERT_FALSE(stats.tensors.empty());
  for (const TensorStats& t : stats.tensors) {
    if (!t.box) {
      continue;
    }
    EXPECT_TRUE(t.sliced) << t.name << ": " << t.fallback;
    EXPECT_EQ(t.bytes_kept, t.bytes_computed) << t.name;
  }
  EXPECT_EQ(model->tok_embeddings->weight.sizes(), c10::IntArrayRef({64, 64}));
  EXPECT_THAT(stats.to_string(), HasSubstr("sliced"));
}

TEST(ShardedMaterialization, ComputesOnlyTheSliceOfConcatenatedAndStackedTensors) {
  for (const int64_t dim : {0, 1}) {
    for (const int64_t world : {2, 3, 7}) {
      for (int64_t rank = 0; rank < world; ++rank) {
        torch::manual_seed(4);
        Joined model = deferred_init([] { return Joined(); });
        const MaterializeStats stats =
            materialize_module(*model, MaterializeOptions().shard({rank, world, dim}));
        for (const TensorStats& t : stats.tensors) {
          if (!t.box) {
            continue;
          }
          EXPECT_TRUE(t.sliced) << t.name << ": " << t.fallback;
          EXPECT_EQ(t.fallback, "") << t.name;
          // A region inside one input is that input's part; across several, the parts and
          // their concatenation (and the cast of a part to the promoted dtype).
          EXPECT_LE(t.bytes_computed, (t.name == "promoted" ? 3 : 2) * t.bytes_kept) << t.name;
          if (t.name == "fused" || (t.name == "qkv" && dim == 0 && world == 3)) {
            EXPECT_EQ(t.bytes_computed, t.bytes_kept) << t.name;
          }
        }
      }
    }
  }
}

// A parameter that was real at record time, and one computed from it.
struct RealParametersImpl : nn::Module {
  explicit RealParametersImpl(const at::Tensor& values) {
    table = register_parameter("table", values);
    torch::NoGradGuard no_grad;
    scaled = register_parameter("scaled", torch::randn({6, 5}) * values);
  }
  at::Tensor table, scaled;
};
TORCH_MODULE(RealParameters);

TEST(ShardedMaterialization, SlicesParametersThatWereRealAtRecordTimeInPlace) {
  auto build = [] {
    torch::manual_seed(6);
    const at::Tensor values = torch::arange(30, torch::kFloat).reshape({6, 5});
    return deferred_init([&] { return RealParameters(values); });
  };
  RealParameters full = build();
  materialize_module(*full, MaterializeOptions().rng(RngMode::kCounter));
  for (const int64_t dim : {0, 1}) {
    for (const int64_t world : {1, 2, 3, 7}) {
      std::map<std::string, std::vector<at::Tensor>> pieces;
      for (int64_t rank = 0; rank < world; ++rank) {
        RealParameters model = build();
        const c10::TensorImpl* table = model->table.unsafeGetTensorImpl();
        const MaterializeStats stats =
            materialize_module(*model, MaterializeOptions().shard({rank, world, dim}));
        EXPECT_EQ(model->table.unsafeGetTensorImpl(), table);
        const auto entry = std::find_if(stats.tensors.begin(), stats.tensors.end(),
                                        [](const TensorStats& t) { return t.name == "table"; });
        ASSERT_NE(entry, stats.tensors.end());
        EXPECT_EQ(entry->fallback, "real at record time");
        EXPECT_EQ(entry->box.has_value(), world > 1);
        EXPECT_EQ(shard_info(model->table).has_value(), world > 1);
        pieces["table"].push_back(model->table);
        pieces["scaled"].push_back(model->scaled);
      }
      EXPECT_TRUE(bitwise_equal(torch::cat(pieces["table"], dim), full->table)) << dim << world;
      EXPECT_TRUE(bitwise_equal(torch::cat(pieces["scaled"], dim), full->scaled)) << dim << world;
    }
  }
}

TEST(ShardedMaterialization, ComputesOnlyTheInputWithoutARegionRuleWhole) {
  auto build = [] {
    torch::manual_seed(0);
    return deferred_init([] {
      auto linear = nn::Linear(8, 6);
      nn::init::orthogonal_(linear->weight);
      return linear;
    });
  };
  nn::Linear full = build();
  materialize_module(*full, MaterializeOptions().rng(RngMode::kCounter));
  nn::Linear model = build();
  const MaterializeStats stats = materialize_module(*model, MaterializeOptions().shard({0, 2}));
  const TensorStats& weight =
      stats.tensors.back().name == "weight" ? stats.tensors.back() : stats.tensors.front();
  ASSERT_EQ(weight.name, "weight");
  // orthogonal_ copies Q of a QR decomposition into the weight: Q is computed whole, the weight
  // itself only in its slice.
  EXPECT_TRUE(weight.sliced);
  EXPECT_THAT(weight.fallback, HasSubstr("linalg_qr"));
  EXPECT_GT(weight.bytes_computed, weight.bytes_kept);
  EXPECT_THAT(stats.to_string(), HasSubstr("inputs computed whole (aten::linalg_qr"));
  EXPECT_TRUE(bitwise_equal(model->weight, full->weight.narrow(0, 0, 3)));
}

// A module whose parameter is itself made by an op with no region rule.
struct ProductImpl : nn::Module {
  ProductImpl() {
    weight = register_parameter("weight", torch::matmul(torch::rand({10, 4}), torch::rand({4, 6})));
  }
  at::Tensor weight;
};
TORCH_MODULE(Product);

TEST(ShardedMaterialization, ComputesATensorWithoutARegionRuleWholeThenSlicesAndSaysWhich) {
  auto build = [] {
    torch::manual_seed(3);
    return deferred_init([] { return Product(); });
  };
  Product full = build();
  materialize_module(*full, MaterializeOptions().rng(RngMode::kCounter));
  Product model = build();
  const MaterializeStats stats = materialize_module(*model, MaterializeOptions().shard({1, 3}));
  ASSERT_EQ(stats.tensors.size(), 1u);
  EXPECT_FALSE(stats.tensors[0].sliced);
  EXPECT_THAT(stats.tensors[0].fallback, HasSubstr("aten::matmul"));
  EXPECT_THAT(stats.to_string(), HasSubstr("whole then sliced"));
  EXPECT_TRUE(bitwise_equal(model->weight, full->weight.narrow(0, 4, 4)));
}

// Note [Region-exact pointwise ops] lists the pointwise ops region replay computes on a slice;
// this is the check it promises: each op, on every floating dtype, sharded at boundaries that are
// not vector aligned (67 x 129 values, dims 0 and 1, W = 3 and 7), must be region replayed (no
// fallback) and concatenate to the bits of the full tensor. Inputs broadcast, as bias-like
// operands do.
struct PointwiseCase {
  std::string name;
  std::function<at::Tensor(const at::Tensor& x, const at::Tensor& row)> f;
};

std::vector<PointwiseCase> region_exact_cases() {
  using T = const at::Tensor&;
  return {
      {"add", [](T x, T r) { return x + r; }},
      {"add_alpha", [](T x, T r) { return torch::add(x, r, 0.37); }},
      {"sub", [](T x, T r) { return x - r; }},
      {"rsub", [](T x, T) { return 1 - x; }},
      {"mul", [](T x, T r) { return x * r; }},
      {"div", [](T x, T r) { return x / (r + 2); }},
      {"neg_abs", [](T x, T r) { return (-(x * r)).abs(); }},
      {"sqrt", [](T x, T) { return x.sqrt(); }},
      {"exp", [](T x, T) { return x.exp(); }},
      {"log", [](T x, T) { return x.log(); }},
      {"log1p", [](T x, T) { return x.log1p(); }},
      {"expm1", [](T x, T) { return x.expm1(); }},
      {"sin", [](T x, T) { return x.sin(); }},
      {"cos", [](T x, T) { return x.cos(); }},
      {"tanh", [](T x, T) { return x.tanh(); }},
      {"erf", [](T x, T) { return x.erf(); }},
      {"erfinv", [](T x, T) { return (x * 2 - 1).erfinv(); }},
      {"atan", [](T x, T) { return x.atan(); }},
      {"clamp", [](T x, T) { return x.clamp(0.2, 0.7); }},
      {"clamp_min_max", [](T x, T) { return x.clamp_min(0.3).clamp_max(0.6); }},
      {"where", [](T x, T r) { return torch::where(r > 0, x, r); }},
      {"sign", [](T x, T r) { return (x * r).sign(); }},
      {"maximum", [](T x, T r) { return torch::maximum(x, r); }},
      {"minimum", [](T x, T r) { return torch::minimum(x, r); }},
      {"fmod", [](T x, T) { return torch::fmod(x, 0.3); }},
      {"remainder", [](T x, T) { return torch::remainder(x, 0.3); }},
      {"square", [](T x, T) { return x.square(); }},
      {"reciprocal", [](T x, T) { return x.reciprocal(); }},
      {"rounding",
       [](T x, T) {
         return (x * 10).floor() + (x * 10).ceil() + (x * 10).round() + (x * 10).trunc();
       }},
      {"masked_fill", [](T x, T r) { return x.masked_fill(r > 0, 0.5); }},
      {"fill_zero", [](T x, T) { return x.clone().fill_(0.25) + x.clone().zero_(); }},
      {"addcmul", [](T x, T r) { return torch::addcmul(x, x, r, 0.3); }},
      {"addcdiv", [](T x, T r) { return torch::addcdiv(x, r, x, 0.3); }},
      {"lerp", [](T x, T r) { return torch::lerp(x, r, 0.3); }},
      {"compare",
       [](T x, T r) {
         return (x.eq(r).to(x.scalar_type()) + x.ne(r).to(x.scalar_type()) +
                 x.lt(r).to(x.scalar_type()) + x.le(r).to(x.scalar_type()) +
                 x.gt(r).to(x.scalar_type()) + x.ge(r).to(x.scalar_type()));
       }},
      {"casts",
       [](T x, T) { return x.to(torch::kDouble).to(x.scalar_type()).clone().contiguous(); }},
      {"copy", [](T x, T r) { return torch::empty_like(x).copy_(r); }},
  };
}

TEST(ShardedMaterialization, RegionReplaysEveryListedPointwiseOpBitExactly) {
  for (const PointwiseCase& c : region_exact_cases()) {
    for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16}) {
      const bool reduced = dtype == torch::kHalf || dtype == torch::kBFloat16;
      auto build = [&] {
        torch::manual_seed(11);
        return deferred_init([&] {
          const auto options = torch::TensorOptions().dtype(dtype);
          const at::Tensor x = torch::rand({67, 129}, options) * 0.9 + 0.05;
          const at::Tensor row = torch::rand({129}, options) - 0.5;
          return c.f(x, row);
        });
      };
      at::Tensor full = build();
      materialize_tensor(full, MaterializeOptions().rng(RngMode::kCounter));
      for (const int64_t dim : {0, 1}) {
        for (const int64_t world : {3, 7}) {
          std::vector<at::Tensor> parts;
          for (int64_t rank = 0; rank < world; ++rank) {
            at::Tensor part = build();
            const MaterializeStats stats = materialize_named_tensors(
                {{"p", part}}, MaterializeOptions().shard({rank, world, dim}));
            const TensorStats& t = stats.tensors.front();
            const std::string where = c.name + " " + std::string(c10::toString(dtype)) + " dim " +
                                      std::to_string(dim) + " world " + std::to_string(world);
            if (c.name == "add_alpha" && reduced) {
              // alpha is applied differently by the vector and scalar loops in these dtypes.
              EXPECT_THAT(t.fallback, HasSubstr("aten::add")) << where;
            } else {
              EXPECT_TRUE(t.sliced && t.fallback.empty()) << where << ": " << t.fallback;
            }
            parts.push_back(part);
          }
          EXPECT_TRUE(bitwise_equal(torch::cat(parts, dim), full))
              << c.name << " " << dtype << " dim " << dim << " world " << world;
        }
      }
    }
  }
}

TEST(ShardedMaterialization, FallsBackForPointwiseOpsWhoseSlicesDifferInTheLastBit) {
  auto build = [] {
    torch::manual_seed(2);
    return deferred_init([] { return torch::sigmoid(torch::rand({40, 33})); });
  };
  at::Tensor part = build();
  const MaterializeStats stats =
      materialize_named_tensors({{"p", part}}, MaterializeOptions().shard({1, 3}));
  EXPECT_FALSE(stats.tensors.front().sliced);
  EXPECT_THAT(stats.tensors.front().fallback, HasSubstr("sigmoid"));
}

TEST(ShardedMaterialization, KeepsIntegerBoundsBeyondDoublePrecision) {
  // 2^60 + 10 is not a double: the bounds must reach the counter RNG as integers.
  const int64_t from = int64_t{1} << 60;
  const int64_t to = from + 10;
  at::Tensor ids =
      deferred_init([&] { return torch::empty({999}, torch::kLong).random_(from, to); });
  materialize_named_tensors({{"ids", ids}}, MaterializeOptions().shard({1, 3}));
  EXPECT_EQ(ids.size(0), 333);
  EXPECT_GE(ids.min().item<int64_t>(), from);
  EXPECT_LT(ids.max().item<int64_t>(), to);
}

TEST(ShardedMaterialization, FillsFullWithTheRecordedScalarExactly) {
  const int64_t big = (int64_t{1} << 60) + 1;  // not a double
  at::Tensor ids = deferred_init([&] { return torch::full({9, 2}, big, torch::kLong); });
  at::Tensor flags = deferred_init([] { return torch::full({9}, true, torch::kBool); });
  materialize_named_tensors({{"ids", ids}, {"flags", flags}}, MaterializeOptions().shard({1, 3}));
  EXPECT_TRUE(torch::equal(ids, torch::full({3, 2}, big, torch::kLong)));
  EXPECT_TRUE(torch::equal(flags, torch::ones({3}, torch::kBool)));
}

TEST(ShardedMaterialization, PadsTrailingShardsWhenAsked) {
  auto linear = deferred_init<nn::Linear>(4, 10);
  materialize_module(*linear, MaterializeOptions().shard({2, 3, 0, /*padded=*/true}));
  EXPECT_EQ(linear->weight.sizes(), c10::IntArrayRef({4, 4}));
  EXPECT_TRUE(torch::equal(linear->weight.narrow(0, 2, 2), torch::zeros({2, 4})));
  const std::optional<ShardInfo> info = shard_info(linear->weight);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->padded);
  EXPECT_EQ(info->box.start[0], 8);
  EXPECT_EQ(info->box.stop[0], 10);
}

TEST(ShardedMaterialization, TakesAGeneralRegionFunction) {
  torch::manual_seed(5);
  auto full = deferred_init<nn::Linear>(9, 8);
  materialize_module(*full, MaterializeOptions().rng(RngMode::kCounter));
  torch::manual_seed(5);
  auto tiled = deferred_init<nn::Linear>(9, 8);
  materialize_module(
      *tiled, MaterializeOptions().region([](const std::string& name, c10::IntArrayRef sizes) {
        return name == "weight" ? std::optional<Box>(Box{{2, 1}, {5, 7}}) : std::nullopt;
      }));
  EXPECT_TRUE(bitwise_equal(tiled->weight, full->weight.narrow(0, 2, 3).narrow(1, 1, 6)));
  EXPECT_TRUE(bitwise_equal(tiled->bias, full->bias));
}

TEST(ShardedMaterialization, SlicesOnesAndZerosWrittenInPlace) {
  auto norm = deferred_init<nn::LayerNorm>(nn::LayerNormOptions({10}));  // fill_(1), zero_()
  const MaterializeStats stats = materialize_module(*norm, MaterializeOptions().shard({1, 3}));
  ASSERT_EQ(stats.tensors.size(), 2);
  for (const TensorStats& t : stats.tensors) {
    EXPECT_TRUE(t.sliced) << t.name << ": " << t.fallback;
  }
  EXPECT_TRUE(bitwise_equal(norm->weight, torch::ones({4})));
  EXPECT_TRUE(bitwise_equal(norm->bias, torch::zeros({4})));
}

// FSDP2's fully_shard, run on a deferred module, records what it does to each parameter: a
// zero padded buffer, one chunk copied in, kept flat. Materializing that flat buffer whole
// through an explicit whole region computes only the chunk of the parameter
// (Note [A region may be the whole tensor], Note [Whole reshapes]).
TEST(ShardedMaterialization, AWholeRegionOfAChunkComputesOnlyTheChunk) {
  auto build = [] {
    torch::manual_seed(3);
    return deferred_init<nn::Linear>(6, 10);
  };
  nn::Linear full = build();
  materialize_module(*full, MaterializeOptions().rng(RngMode::kCounter));
  nn::Linear model = build();
  const at::Tensor chunk = model->weight.detach().chunk(3, 0)[2];  // rows 8 and 9 of 10
  const at::Tensor padded = chunk.new_zeros({4, 6});
  padded.narrow(0, 0, 2).copy_(chunk);
  const at::Tensor flat = padded.view(-1);
  const MaterializeStats stats = materialize_named_tensors(
      {{"flat", flat, true}},
      MaterializeOptions().region([](const std::string&, c10::IntArrayRef sizes) {
        return std::optional<Box>(whole(sizes));
      }));
  ASSERT_EQ(stats.tensors.size(), 1);
  EXPECT_TRUE(stats.tensors[0].sliced) << stats.tensors[0].fallback;
  EXPECT_EQ(stats.tensors[0].bytes_computed, 2 * 6 * 4 + 4 * 6 * 4);  // the chunk, the buffer
  EXPECT_TRUE(is_fake(model->weight));
  EXPECT_TRUE(bitwise_equal(flat.view({4, 6}).narrow(0, 0, 2), full->weight.narrow(0, 8, 2)));
  EXPECT_TRUE(torch::equal(flat.view({4, 6}).narrow(0, 2, 2), torch::zeros({2, 6})));
}

TEST(ShardedMaterializationErrors, ARegionOutsideTheTensorIsNamedAndNothingIsLost) {
  auto linear = deferred_init<nn::Linear>(4, 3);
  const std::string message = error_of([&] {
    materialize_module(
        *linear, MaterializeOptions().region([](const std::string&, c10::IntArrayRef sizes) {
          return std::optional<Box>(
              Box{std::vector<int64_t>(sizes.size(), 0), std::vector<int64_t>(sizes.size(), 5)});
        }));
  });
  EXPECT_THAT(message, HasSubstr("region for 'weight'"));
  EXPECT_THAT(message, HasSubstr("outside the tensor"));
  EXPECT_TRUE(is_fake(linear->weight));
  EXPECT_TRUE(is_fake(linear->bias));
}

}  // namespace
}  // namespace torchdefer
