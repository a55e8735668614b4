// A small JSON reader for the headers and indexes of checkpoint files: safetensors headers and
// model.safetensors.index.json are JSON, and nothing else in the library parses JSON.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torchdefer::detail {

// One parsed JSON value. Numbers keep their text; as_int() reads integers exactly (offsets and
// sizes beyond 2**53 stay exact, which a double would not).
class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Parses `text`, which must hold exactly one value; throws c10::Error naming `what` (the
  // file) and the byte offset on malformed input, an object that repeats a key included.
  static JsonValue parse(std::string_view text, const std::string& what);

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::kObject; }
  // These throw c10::Error naming `what` when the value is of another kind.
  const std::string& as_string(const std::string& what) const;
  int64_t as_int(const std::string& what) const;
  const std::vector<JsonValue>& as_array(const std::string& what) const;
  const std::map<std::string, JsonValue>& as_object(const std::string& what) const;
  // The member `key` of an object, or nullptr.
  const JsonValue* find(const std::string& key) const;

 private:
  class Parser;
  Kind kind_ = Kind::kNull;
  std::string text_;  // a string's value, a number's text, "true"/"false"
  std::vector<JsonValue> array_;
  std::map<std::string, JsonValue> object_;
};

}  // namespace torchdefer::detail
