// Checkpoints: the safetensors reader reads exactly a box's bytes into any destination, refuses
// malformed files by name, and materialize_module reads what a checkpoint holds and initializes
// the rest as eager construction does, all or nothing.
#include <torchdefer/torchdefer.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/cpp/test_util.h"

#include "api/src/json_value.h"
#include "api/src/safetensors_file.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace torchdefer {
namespace {

using testing::bitwise_equal;
using testing::error_of;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Writes `tensors` in the safetensors format (its header written by hand, as the format says).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::string& extra_header = "") {
  const std::map<c10::ScalarType, std::string> names = {
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"}};
  std::string header = "{" + extra_header;
  std::string data;
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.contiguous();
    const auto begin = data.size();
    data.append(static_cast<const char*>(c.data_ptr()), c.nbytes());
    header += (header.size() > 1 ? "," : "") + std::string("\"") + name + "\":{\"dtype\":\"" +
              names.at(c.scalar_type()) + "\",\"shape\":[";
    for (int64_t d = 0; d < c.dim(); ++d) {
      header += (d ? "," : "") + std::to_string(c.size(d));
    }
    header +=
        "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) + "]}";
  }
  header += "}";
  std::ofstream out(path, std::ios::binary);
  uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) {
    out.put(static_cast<char>((length >> (8 * i)) & 0xFF));
  }
  out << header << data;
}

std::string scratch(const std::string& name) {
  return (fs::temp_directory_path() / ("torchdefer_" + name + "_" + std::to_string(::getpid())))
      .string();
}

at::Tensor read_box(const detail::SafetensorsFile& file, const std::string& name, const Box& box,
                    at::ScalarType dtype, detail::StagingBuffer& staging) {
  at::Tensor out = at::empty(box.sizes(), at::TensorOptions().dtype(dtype));
  file.read(name, box, out, staging);
  return out;
}

at::Tensor read_box(const detail::SafetensorsFile& file, const std::string& name, const Box& box,
                    at::ScalarType dtype) {
  detail::StagingBuffer staging;
  return read_box(file, name, box, dtype, staging);
}

at::Tensor slice_of(const at::Tensor& t, const Box& box) {
  at::Tensor s = t;
  for (int64_t d = 0; d < t.dim(); ++d) {
    s = s.slice(d, box.start[d], box.stop[d]);
  }
  return s;
}

TEST(SafetensorsFile, ReadsRowColumnAndInnerBoxesByteForByte) {
  const std::string path = scratch("boxes.safetensors");
  const at::Tensor cube = torch::randn({5, 6, 7});
  const at::Tensor scalar = torch::randn({});
  write_safetensors(path, {{"cube", cube}, {"scalar", scalar}},
                    "\"__metadata__\":{\"format\":\"pt\"}");
  const detail::SafetensorsFile file(path);
  for (const Box& box :
       {Box{{0, 0, 0}, {5, 6, 7}}, Box{{2, 0, 0}, {4, 6, 7}}, Box{{0, 3, 0}, {5, 5, 7}},
        Box{{1, 2, 3}, {4, 5, 6}}, Box{{1, 2, 3}, {1, 5, 6}}}) {
    EXPECT_TRUE(bitwise_equal(read_box(file, "cube", box, at::kFloat), slice_of(cube, box)));
  }
  EXPECT_TRUE(bitwise_equal(read_box(file, "scalar", Box{}, at::kFloat), scalar));
  std::remove(path.c_str());
}

TEST(SafetensorsFile, CastsThroughABoundedBufferWhenTheDtypeDiffers) {
  const std::string path = scratch("cast.safetensors");
  // Just over 64 MB of float: more than one staging buffer's worth.
  const int64_t n = (64 << 20) / 4 + 3;
  const at::Tensor big = torch::randn({n});
  const at::Tensor small = torch::randn({3, 4}).to(at::kBFloat16);
  write_safetensors(path, {{"big", big}, {"small", small}});
  const detail::SafetensorsFile file(path);
  EXPECT_TRUE(bitwise_equal(read_box(file, "big", Box{{5}, {n}}, at::kDouble),
                            big.slice(0, 5).to(at::kDouble)));
  EXPECT_TRUE(bitwise_equal(read_box(file, "small", Box{{0, 1}, {3, 3}}, at::kFloat),
                            small.slice(1, 1, 3).to(at::kFloat)));
  std::remove(path.c_str());
}

TEST(SafetensorsFile, CastsReadsOfABatchThroughOneSharedBufferWhateverTheirSizes) {
  const std::string path = scratch("shared_staging.safetensors");
  const at::Tensor small = torch::randn({7, 5});
  const at::Tensor big = torch::randn({300, 301});
  const at::Tensor odd = torch::randn({11}).to(at::kBFloat16);
  write_safetensors(path, {{"small", small}, {"big", big}, {"odd", odd}});
  const detail::SafetensorsFile file(path);
  // Small, then larger (the buffer grows), then smaller again (only its front is used).
  detail::StagingBuffer staging;
  EXPECT_TRUE(bitwise_equal(read_box(file, "small", Box{{0, 0}, {7, 5}}, at::kDouble, staging),
                            small.to(at::kDouble)));
  EXPECT_TRUE(bitwise_equal(read_box(file, "big", Box{{0, 1}, {300, 300}}, at::kDouble, staging),
                            big.slice(1, 1, 300).to(at::kDouble)));
  EXPECT_TRUE(bitwise_equal(read_box(file, "odd", Box{{2}, {9}}, at::kFloat, staging),
                            odd.slice(0, 2, 9).to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(read_box(file, "small", Box{{3, 0}, {5, 5}}, at::kBFloat16, staging),
                            small.slice(0, 3, 5).to(at::kBFloat16)));
  std::remove(path.c_str());
}

TEST(SafetensorsFile, RefusesMalformedFilesNamingTheFileAndTensor) {
  const std::string path = scratch("bad.safetensors");
  write_safetensors(path, {{"w", torch::randn({2, 2})}});
  fs::resize_file(path, fs::file_size(path) - 4);
  EXPECT_THAT(error_of([&] { detail::SafetensorsFile file(path); }),
              HasSubstr("'w' in " + path + "'s bytes [0, 16) lie outside the file"));
  write_safetensors(path, {}, "\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,0]}");
  EXPECT_THAT(error_of([&] { detail::SafetensorsFile file(path); }),
              HasSubstr("holds 0 bytes, but its shape and dtype need 12"));
  write_safetensors(path, {}, "\"w\":{\"dtype\":\"Q4\",\"shape\":[],\"data_offsets\":[0,0]}");
  EXPECT_THAT(error_of([&] { detail::SafetensorsFile file(path); }),
              HasSubstr("has dtype \"Q4\", which torchdefer does not read"));
  write_safetensors(path, {}, "\"w\":{\"dtype\":\"F32\",\"shape\":[1,]}");
  EXPECT_THAT(error_of([&] { detail::SafetensorsFile file(path); }),
              HasSubstr("is not valid JSON"));
  std::remove(path.c_str());
}

TEST(SafetensorsFile, RefusesAHeaderThatRepeatsANameNamingTheNameAndTheFile) {
  const std::string path = scratch("repeated.safetensors");
  // Two entries for one name, each valid alone, over the same 4 bytes (four U8, or one F32):
  // which of them a reader keeps would decide what it reads.
  write_safetensors(path, {{"w", torch::ones({1})}},
                    "\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}");
  const std::string error = error_of([&] { detail::SafetensorsFile file(path); });
  EXPECT_THAT(error, HasSubstr("the header of " + path + " repeats the key \"w\" (at byte 53)"));
  EXPECT_THAT(error, HasSubstr("the safetensors format requires unique names"));
  // A member repeated inside one tensor's entry is as ambiguous.
  write_safetensors(path, {},
                    "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,0],"
                    "\"data_offsets\":[0,4]}");
  EXPECT_THAT(error_of([&] { detail::SafetensorsFile file(path); }),
              HasSubstr("repeats the key \"data_offsets\" inside \"w\""));
  std::remove(path.c_str());
}

TEST(JsonValue, DecodesEscapesAndKeepsLargeIntegersExact) {
  const auto v = detail::JsonValue::parse(
      R"({"a\u00e9\ud83d\ude00\n": [9007199254740993, true, null, -2.5e3]})", "test");
  const auto& object = v.as_object("test");
  ASSERT_EQ(object.size(), 1u);
  EXPECT_EQ(object.begin()->first, "a\xc3\xa9\xf0\x9f\x98\x80\n");
  EXPECT_EQ(object.begin()->second.as_array("test")[0].as_int("test"), 9007199254740993LL);
  EXPECT_THAT(error_of([] { detail::JsonValue::parse("[1] 2", "x"); }),
              HasSubstr("x is not valid JSON at byte 4"));
}

TEST(MaterializeCheckpoint, ReadsWhatTheCheckpointHoldsAndInitializesTheRestAsEager) {
  torch::manual_seed(0);
  torch::nn::Linear eager(6, 10);
  const std::string path = scratch("linear.safetensors");
  const at::Tensor weight = torch::randn({10, 6}, at::kDouble);
  write_safetensors(path, {{"weight", weight}});
  torch::manual_seed(0);
  auto model = deferred_init<torch::nn::Linear>(6, 10);
  const MaterializeStats stats =
      materialize_module(*model, MaterializeOptions().checkpoint(open_safetensors(path)));
  EXPECT_TRUE(bitwise_equal(model->weight, weight.to(at::kFloat)));
  EXPECT_TRUE(bitwise_equal(model->bias, eager->bias));
  EXPECT_TRUE(model->weight.requires_grad());
  ASSERT_EQ(stats.tensors.size(), 2u);
  for (const TensorStats& t : stats.tensors) {
    EXPECT_EQ(t.source, t.name == "weight" ? "checkpoint" : "init") << t.name;
  }
  EXPECT_THAT(stats.to_string(), HasSubstr("weight [10, 6] whole, read from the checkpoint"));
  EXPECT_THAT(stats.to_string(), HasSubstr("1 read from the checkpoint"));
  std::remove(path.c_str());
}

TEST(MaterializeCheckpoint, RefusesAnIndexThatRepeatsANameLoadingNothing) {
  const fs::path dir = scratch("repeated_index");
  fs::create_directories(dir);
  write_safetensors((dir / "a.safetensors").string(), {{"weight", torch::randn({10, 6})}});
  write_safetensors((dir / "b.safetensors").string(), {{"weight", torch::randn({10, 6})}});
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"weight": "a.safetensors", "weight": "b.safetensors"}})";
  auto model = deferred_init<torch::nn::Linear>(6, 10);
  EXPECT_THAT(error_of([&] {
                materialize_module(*model,
                                   MaterializeOptions().checkpoint(open_safetensors(dir.string())));
              }),
              HasSubstr((dir / "model.safetensors.index.json").string() +
                        " repeats the key \"weight\" inside \"weight_map\""));
  EXPECT_TRUE(is_fake(model->weight));
  EXPECT_TRUE(is_fake(model->bias));
  fs::remove_all(dir);
}

TEST(MaterializeCheckpoint, ReadsOnlyThisRanksBoxWhenSharding) {
  const std::string path = scratch("shard.safetensors");
  const at::Tensor weight = torch::randn({10, 6});
  write_safetensors(path, {{"weight", weight}, {"bias", torch::randn({10})}});
  auto model = deferred_init<torch::nn::Linear>(6, 10);
  materialize_module(*model, MaterializeOptions()
                                 .shard(Shard{1, 3, 0, /*padded=*/true})
                                 .checkpoint(open_safetensors(path)));
  EXPECT_TRUE(bitwise_equal(model->weight, weight.slice(0, 4, 8)));
  std::remove(path.c_str());
}

TEST(MaterializeCheckpoint, RefusesUnexpectedNamesAndMismatchedShapesLoadingNothing) {
  const std::string path = scratch("bad_linear.safetensors");
  write_safetensors(path, {{"weight", torch::randn({10, 6})},
                           {"bias", torch::randn({11})},
                           {"extra", torch::randn({1})}});
  auto model = deferred_init<torch::nn::Linear>(6, 10);
  const auto reader = open_safetensors(path);
  EXPECT_THAT(
      error_of([&] { materialize_module(*model, MaterializeOptions().checkpoint(reader)); }),
      HasSubstr("1 tensor(s) of the checkpoint match no parameter or buffer of the "
                "module; nothing was loaded:\n  extra"));
  EXPECT_THAT(error_of([&] {
                materialize_module(*model, MaterializeOptions().checkpoint(reader).strict(false));
              }),
              HasSubstr("bias: the checkpoint's shape [11], the module's [10]"));
  EXPECT_TRUE(is_fake(model->weight));
  EXPECT_TRUE(is_fake(model->bias));
  std::remove(path.c_str());
}

// A module whose `scale` buffer is a real tensor handed to construction, next to a fake weight.
struct ScaledImpl : torch::nn::Module {
  explicit ScaledImpl(const at::Tensor& values) {
    weight = register_parameter("weight", torch::randn({4, 3}));
    scale = register_buffer("scale", values);
  }
  at::Tensor weight;
  at::Tensor scale;
};
TORCH_MODULE(Scaled);

TEST(MaterializeCheckpoint, LoadsATensorRealAtRecordTimeInPlaceAtCommit) {
  const std::string path = scratch("scaled.safetensors");
  const at::Tensor weight = torch::randn({4, 3});
  const at::Tensor scale = torch::tensor({1.0, -3.0}, at::kDouble);
  write_safetensors(path, {{"weight", weight}, {"scale", scale}});
  const at::Tensor values = torch::tensor({2.5, 0.5});
  auto model = deferred_init([&] { return Scaled(values); });
  ASSERT_FALSE(is_fake(model->scale));
  const void* storage = model->scale.data_ptr();
  const auto version = model->scale._version();
  const MaterializeStats stats =
      materialize_module(*model, MaterializeOptions().checkpoint(open_safetensors(path)));
  EXPECT_TRUE(bitwise_equal(model->weight, weight));
  EXPECT_TRUE(bitwise_equal(model->scale, scale.to(at::kFloat)));
  EXPECT_EQ(model->scale.data_ptr(), storage);  // copied into, as load_state_dict does
  EXPECT_GT(model->scale._version(), version);
  ASSERT_EQ(stats.tensors.size(), 2u);
  for (const TensorStats& t : stats.tensors) {
    EXPECT_EQ(t.source, "checkpoint") << t.name;
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace torchdefer
