// open_safetensors: one safetensors file, or the files of a save_pretrained directory joined by
// their model.safetensors.index.json, as one CheckpointReader.
#include <torchdefer/materialize.h>

#include "json_value.h"
#include "safetensors_file.h"

#include <c10/util/Exception.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torchdefer {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

class SafetensorsCheckpoint final : public CheckpointReader {
 public:
  explicit SafetensorsCheckpoint(const std::string& path) {
    const fs::path p(path);
    if (fs::is_directory(p)) {
      if (fs::exists(p / kIndexName)) {
        open_index(p / kIndexName);
      } else {
        TORCH_CHECK(fs::exists(p / kSingleName), "torchdefer: the checkpoint directory ", path,
                    " holds neither ", kIndexName, " nor ", kSingleName,
                    "; pass a .safetensors file or a directory save_pretrained wrote");
        open_file((p / kSingleName).string());
      }
    } else if (p.extension() == ".json") {
      open_index(p);
    } else {
      open_file(path);
    }
  }

  const std::map<std::string, CheckpointTensor>& tensors() const override { return tensors_; }

  void read(const std::string& name, const Box& box, const at::Tensor& out) const override {
    detail::StagingBuffer staging;
    file_holding(name).read(name, box, out, staging);
  }

  // The reads share one staging buffer (Note [One staging buffer for a batch]).
  void read_all(const std::vector<CheckpointRead>& reads) const override {
    detail::StagingBuffer staging;
    for (const CheckpointRead& r : reads) {
      file_holding(r.name).read(r.name, r.box, r.out, staging);
    }
  }

 private:
  const detail::SafetensorsFile& file_holding(const std::string& name) const {
    const auto it = file_of_.find(name);
    TORCH_CHECK(it != file_of_.end(), "torchdefer: the checkpoint holds no tensor '", name, "'");
    return *it->second;
  }

  void open_file(const std::string& path) {
    files_.push_back(std::make_unique<detail::SafetensorsFile>(path));
    const detail::SafetensorsFile& file = *files_.back();
    for (const auto& [name, entry] : file.entries()) {
      TORCH_CHECK(tensors_.emplace(name, entry.meta).second, "torchdefer: '", name,
                  "' is in more than one file of the checkpoint (", file.path(), " and ",
                  file_of_.at(name)->path(), ")");
      file_of_.emplace(name, &file);
    }
  }

  // The index maps each tensor to the file holding it; every file it names is opened (headers
  // only), and each must hold exactly the tensors the index gives it.
  void open_index(const fs::path& index_path) {
    std::ifstream in(index_path);
    TORCH_CHECK(in, "torchdefer: cannot open ", index_path.string());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string what = index_path.string();
    const detail::JsonValue index = detail::JsonValue::parse(text, what);
    const detail::JsonValue* weight_map = index.find("weight_map");
    TORCH_CHECK(weight_map != nullptr, "torchdefer: ", what, " has no \"weight_map\"");
    std::map<std::string, std::string> file_names;  // tensor -> file
    std::map<std::string, bool> opened;
    for (const auto& [name, file] : weight_map->as_object(what + "'s weight_map")) {
      file_names[name] = file.as_string(what + "'s entry for '" + name + "'");
      opened.emplace(file_names[name], false);
    }
    for (const auto& [file, _] : opened) {
      open_file((index_path.parent_path() / file).string());
    }
    for (const auto& [name, file] : file_names) {
      const auto it = file_of_.find(name);
      TORCH_CHECK(it != file_of_.end() && fs::path(it->second->path()).filename() == file,
                  "torchdefer: ", what, " places '", name, "' in ", file,
                  ", but that file does not hold it");
    }
    TORCH_CHECK(file_of_.size() == file_names.size(), "torchdefer: the files ", what,
                " names hold tensors it does not list");
  }

  std::vector<std::unique_ptr<detail::SafetensorsFile>> files_;
  std::map<std::string, CheckpointTensor> tensors_;
  std::map<std::string, const detail::SafetensorsFile*> file_of_;
};

}  // namespace

std::shared_ptr<CheckpointReader> open_safetensors(const std::string& path) {
  return std::make_shared<SafetensorsCheckpoint>(path);
}

}  // namespace torchdefer
