// Value reads of recorded fakes (Note [Reading values while recording]) through the reductions and
// searches init code uses, during deferred_init and after it returned, in a C++-only process.
#include <torchdefer/torchdefer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torchdefer {
namespace {

using Read = std::function<at::Tensor(const at::Tensor&)>;

// Value-reading patterns: each ends in a host value (item, a tensor read by a data-dependent op).
std::vector<std::pair<std::string, Read>> patterns() {
  auto item = [](const at::Tensor& t) { return torch::tensor(t.item<double>(), at::kDouble); };
  return {
      {"abs().max().item()", [=](const at::Tensor& t) { return item(t.abs().max()); }},
      {"min().item()", [=](const at::Tensor& t) { return item(t.min()); }},
      {"max(dim)", [=](const at::Tensor& t) { return item(std::get<0>(t.max(0)).sum()); }},
      {"min(dim)", [=](const at::Tensor& t) { return item(std::get<0>(t.min(1)).sum()); }},
      {"amax", [=](const at::Tensor& t) { return item(t.amax()); }},
      {"amin", [=](const at::Tensor& t) { return item(t.amin()); }},
      {"aminmax", [=](const at::Tensor& t) { return item(std::get<1>(at::aminmax(t))); }},
      {"norm", [=](const at::Tensor& t) { return item(t.norm()); }},
      {"vector_norm inf",
       [=](const at::Tensor& t) { return item(at::linalg_vector_norm(t, INFINITY)); }},
      {"std", [=](const at::Tensor& t) { return item(t.std()); }},
      {"var", [=](const at::Tensor& t) { return item(t.var()); }},
      {"std_mean", [=](const at::Tensor& t) { return item(std::get<0>(at::std_mean(t))); }},
      {"var_mean", [=](const at::Tensor& t) { return item(std::get<1>(at::var_mean(t))); }},
      {"mean", [=](const at::Tensor& t) { return item(t.mean()); }},
      {"sum", [=](const at::Tensor& t) { return item(t.sum()); }},
      {"prod", [=](const at::Tensor& t) { return item(t.prod()); }},
      {"any", [=](const at::Tensor& t) { return item((t > 0).any()); }},
      {"all", [=](const at::Tensor& t) { return item((t > -1).all()); }},
      {"is_nonzero",
       [=](const at::Tensor& t) { return torch::tensor((t.sum() > 0).is_nonzero()); }},
      {"allclose", [=](const at::Tensor& t) { return torch::tensor(at::allclose(t, t * 1.0)); }},
      {"equal", [=](const at::Tensor& t) { return torch::tensor(at::equal(t, t.clone())); }},
      {"nonzero", [=](const at::Tensor& t) { return (t > 0).nonzero(); }},
      {"where(condition)", [=](const at::Tensor& t) { return at::where(t > 0)[1]; }},
      {"unique",
       [=](const at::Tensor& t) { return std::get<0>(at::_unique2((t > 0).to(at::kInt))); }},
      {"topk", [=](const at::Tensor& t) { return item(std::get<0>(t.flatten().topk(2)).sum()); }},
      {"sort", [=](const at::Tensor& t) { return item(std::get<0>(t.flatten().sort())[0]); }},
      {"argsort", [=](const at::Tensor& t) { return item(t.flatten().argsort()[0]); }},
      {"median", [=](const at::Tensor& t) { return item(t.median()); }},
      {"median(dim)", [=](const at::Tensor& t) { return item(std::get<0>(t.median(0)).sum()); }},
      {"nanmedian", [=](const at::Tensor& t) { return item(t.nanmedian()); }},
      {"quantile", [=](const at::Tensor& t) { return item(at::quantile(t.flatten(), 0.5)); }},
      {"histc", [=](const at::Tensor& t) { return at::histc(t, 4); }},
      {"argmax", [=](const at::Tensor& t) { return item(t.argmax()); }},
      {"argmin", [=](const at::Tensor& t) { return item(t.argmin()); }},
      {"kthvalue", [=](const at::Tensor& t) { return item(std::get<0>(t.flatten().kthvalue(2))); }},
      {"mode", [=](const at::Tensor& t) { return item(std::get<0>(t.flatten().mode())); }},
      {"cummax", [=](const at::Tensor& t) { return item(std::get<0>(t.flatten().cummax(0))[-1]); }},
      {"logsumexp", [=](const at::Tensor& t) { return item(t.logsumexp(0).sum()); }},
      {"count_nonzero", [=](const at::Tensor& t) { return item(at::count_nonzero(t > 0)); }},
      {"isnan().any()", [=](const at::Tensor& t) { return item(at::isnan(t).any()); }},
      {"isfinite().all()", [=](const at::Tensor& t) { return item(at::isfinite(t).all()); }},
      {"nansum", [=](const at::Tensor& t) { return item(t.nansum()); }},
      {"nanmean", [=](const at::Tensor& t) { return item(t.nanmean()); }},
      {"msort", [=](const at::Tensor& t) { return item(t.msort()[0].sum()); }},
      {"searchsorted",
       [=](const at::Tensor& t) {
         const at::Tensor flat = t.flatten();
         return at::searchsorted(std::get<0>(flat.sort()), flat);
       }},
      {"bincount",
       [=](const at::Tensor& t) { return at::bincount((t.abs() * 3).to(at::kLong).flatten()); }},
      {"dist", [=](const at::Tensor& t) { return item(at::dist(t, t * 2)); }},
      {"cdist", [=](const at::Tensor& t) { return item(at::cdist(t, t).max()); }},
      {"trace", [=](const at::Tensor& t) { return item(t.trace()); }},
      {"masked_select", [=](const at::Tensor& t) { return item(t.masked_select(t > 0).sum()); }},
      {"clamp by max",
       [=](const at::Tensor& t) { return item(t.clamp(std::nullopt, t.max()).sum()); }},
      {"svdvals", [=](const at::Tensor& t) { return item(at::linalg_svdvals(t)[0]); }},
      {"matrix_norm 2", [=](const at::Tensor& t) { return item(at::linalg_matrix_norm(t, 2)); }},
      {"renorm", [=](const at::Tensor& t) { return item(t.renorm(2, 0, 1.0).sum()); }},
      {"cumsum", [=](const at::Tensor& t) { return item(t.cumsum(0)[-1].sum()); }},
      {"softmax max", [=](const at::Tensor& t) { return item(t.softmax(-1).max()); }},
  };
}

// Each pattern gives eager's host value (bitwise) on a recorded fake: inside deferred_init, and on
// the fake it returned. Before the meta rules of Note [Meta rules of value-reading reductions],
// most reductions here failed in a C++-only process ("aten::max ... has no meta kernel"); quantile
// failed inside deferred_init until Note [Composite ops that read values inside].
TEST(ValueReads, ReductionsAndSearchesReadEagersValuesDuringAndAfterDeferredInit) {
  for (const auto& [name, read] : patterns()) {
    for (const bool after : {false, true}) {
      torch::manual_seed(0);
      const at::Tensor expected = read(torch::randn({4, 5}));
      std::string error;
      try {
        torch::manual_seed(0);
        at::Tensor got;
        at::Tensor w = deferred_init([&] {
          at::Tensor w = torch::randn({4, 5});
          if (!after) {
            got = read(w);
          }
          return w;
        });
        if (after) {
          got = read(w);
        }
        EXPECT_TRUE(is_fake(w));
        if (!testing::bitwise_equal(expected, got)) {
          error = "values differ";
        }
      } catch (const std::exception& e) {
        const std::string what = e.what();
        error = what.substr(0, what.find('\n'));  // without the C++ stack
      }
      EXPECT_EQ(error, "") << name
                           << (after ? " after deferred_init returned" : " while recording");
    }
  }
}

// The meta rules shape each op as its CPU kernel does, for the dimension arguments they take.
TEST(ValueReads, MetaRulesGiveTheShapesAndDtypesOfTheCpuKernels) {
  const at::Tensor x = torch::randn({3, 4, 5});
  const at::Tensor ints = torch::randint(0, 5, {3, 4}, at::kInt);
  std::vector<std::pair<
      std::string, std::function<std::vector<at::Tensor>(const at::Tensor&, const at::Tensor&)>>>
      calls = {
          {"std dim keepdim", [](auto& t, auto&) { return std::vector{t.std({1}, 1, true)}; }},
          {"var dims",
           [](auto& t, auto&) {
             return std::vector{t.var({0, 2}, 0, false)};
           }},
          {"var_mean -1",
           [](auto& t, auto&) {
             auto [v, m] = at::var_mean(t, {-1}, 1, true);
             return std::vector{v, m};
           }},
          {"median dim",
           [](auto& t, auto&) {
             auto [v, i] = t.median(1, true);
             return std::vector{v, i};
           }},
          {"kthvalue",
           [](auto& t, auto&) {
             auto [v, i] = t.kthvalue(2, 0);
             return std::vector{v, i};
           }},
          {"mode",
           [](auto& t, auto&) {
             auto [v, i] = t.mode(-1, true);
             return std::vector{v, i};
           }},
          {"cummin",
           [](auto& t, auto&) {
             auto [v, i] = t.cummin(1);
             return std::vector{v, i};
           }},
          {"count_nonzero dims",
           [](auto& t, auto&) {
             return std::vector{at::count_nonzero(t, {0, 2})};
           }},
          {"nansum dim dtype",
           [](auto& t, auto&) { return std::vector{at::nansum(t, {1}, true, at::kDouble)}; }},
          {"prod of ints", [](auto&, auto& i) { return std::vector{i.prod()}; }},
          {"trace of ints", [](auto&, auto& i) { return std::vector{i.trace()}; }},
          {"nansum of ints", [](auto&, auto& i) { return std::vector{i.nansum()}; }},
          {"logical_xor broadcast",
           [](auto& t, auto& i) {
             return std::vector{at::logical_xor(t[0] > 0, i.unsqueeze(-1).expand({3, 4, 5})[0])};
           }},
          {"searchsorted int32",
           [](auto& t, auto&) {
             return std::vector{at::searchsorted(t.flatten(), t[0], /*out_int32=*/true)};
           }},
          {"searchsorted scalar",
           [](auto& t, auto&) {
             return std::vector{at::searchsorted(t.flatten(), at::Scalar(0.5))};
           }},
          {"cdist batched",
           [](auto& t, auto&) { return std::vector{at::cdist(t, t[0].unsqueeze(0))}; }},
          {"cummax of a transposed tensor",
           [](auto& t, auto&) {
             auto [v, i] = t[0].t().cummax(0);
             return std::vector{v, i};
           }},
          {"isnan of a transposed tensor",
           [](auto& t, auto&) { return std::vector{at::isnan(t[0].t())}; }},
      };
  for (const auto& [name, call] : calls) {
    const std::vector<at::Tensor> expected = call(x, ints);
    std::vector<at::Tensor> got;
    {
      FakeMode fake;
      got = call(at::empty(x.sizes()), at::empty(ints.sizes(), at::kInt));
    }
    ASSERT_EQ(got.size(), expected.size()) << name;
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(is_fake(got[k])) << name;
      EXPECT_EQ(got[k].sizes(), expected[k].sizes()) << name << " output " << k;
      EXPECT_EQ(got[k].scalar_type(), expected[k].scalar_type()) << name << " output " << k;
      EXPECT_EQ(got[k].strides(), expected[k].strides()) << name << " output " << k;
    }
  }
}

TEST(ValueReads, MetaRulesRefuseWhatTheCpuKernelsRefuse) {
  const at::Tensor x = torch::randn({3, 4});
  std::vector<std::pair<std::string, std::function<void(const at::Tensor&)>>> calls = {
      {"max of an empty tensor", [](auto& t) { t.narrow(0, 0, 0).max(); }},
      {"trace of a vector", [](auto& t) { t[0].trace(); }},
      {"var of ints", [](auto& t) { t.to(at::kInt).var(); }},
      {"kthvalue beyond the dimension", [](auto& t) { t.kthvalue(9, 1); }},
      {"median along an empty dimension", [](auto& t) { t.narrow(1, 0, 0).median(1); }},
      {"count_nonzero with a repeated dim",
       [](auto& t) {
         at::count_nonzero(t, {0, 0});
       }},
  };
  for (const auto& [name, call] : calls) {
    EXPECT_THROW(call(x), c10::Error) << name << " (eager)";
    FakeMode fake;
    EXPECT_THROW(call(at::empty(x.sizes())), c10::Error) << name << " (fake)";
  }
}

}  // namespace
}  // namespace torchdefer
