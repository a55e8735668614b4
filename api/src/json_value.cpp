// The JSON reader behind checkpoint headers (json_value.h).
#include "json_value.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>

namespace torchdefer::detail {

// A recursive-descent parser over the text; nesting is bounded so that a hostile header cannot
// overflow the stack.
class JsonValue::Parser {
 public:
  Parser(std::string_view text, const std::string& what) : text_(text), what_(what) {}

  JsonValue document() {
    JsonValue value = parse_value(0);
    skip_space();
    expect(pos_ == text_.size(), "unexpected text after the value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  void expect(bool ok, const char* message) const {
    TORCH_CHECK(ok, "torchdefer: ", what_, " is not valid JSON at byte ", pos_, ": ", message);
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }

  char peek() {
    skip_space();
    expect(pos_ < text_.size(), "unexpected end");
    return text_[pos_];
  }

  void consume(char c) {
    expect(peek() == c, "unexpected character");
    ++pos_;
  }

  JsonValue parse_value(int depth) {
    expect(depth < kMaxDepth, "nested too deeply");
    const char c = peek();
    JsonValue value;
    if (c == '{') {
      value.kind_ = Kind::kObject;
      parse_object(value, depth);
    } else if (c == '[') {
      value.kind_ = Kind::kArray;
      parse_array(value, depth);
    } else if (c == '"') {
      value.kind_ = Kind::kString;
      value.text_ = parse_string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      value.kind_ = Kind::kNumber;
      value.text_ = parse_number();
    } else {
      parse_literal(value);
    }
    return value;
  }

  void parse_object(JsonValue& value, int depth) {
    consume('{');
    if (peek() == '}') {
      ++pos_;
      return;
    }
    while (true) {
      expect(peek() == '"', "expected a member name");
      const size_t key_at = pos_;
      std::string key = parse_string();
      // Refused here, not in the safetensors reader: only the parser sees both values, and a key
      // repeated at any depth (a tensor's name, its data_offsets, an index's entry) is as
      // ambiguous, since readers that keep the first value and readers that keep the last would
      // read different tensors from one file.
      TORCH_CHECK(value.object_.count(key) == 0, "torchdefer: ", what_, " repeats the key \"", key,
                  "\"", enclosing_.empty() ? "" : " inside \"" + *enclosing_.back() + "\"",
                  " (at byte ", key_at, "): the safetensors format requires unique names, and ",
                  "JSON leaves open which of the two values a reader takes (one tensor can shadow ",
                  "another); write the file again with each name once");
      consume(':');
      enclosing_.push_back(&key);
      JsonValue member = parse_value(depth + 1);
      enclosing_.pop_back();
      value.object_.emplace(std::move(key), std::move(member));
      if (peek() == '}') {
        ++pos_;
        return;
      }
      consume(',');
    }
  }

  void parse_array(JsonValue& value, int depth) {
    consume('[');
    if (peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      value.array_.push_back(parse_value(depth + 1));
      if (peek() == ']') {
        ++pos_;
        return;
      }
      consume(',');
    }
  }

  void parse_literal(JsonValue& value) {
    for (const char* literal : {"true", "false", "null"}) {
      const std::string_view word(literal);
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        value.kind_ = word == "null" ? Kind::kNull : Kind::kBool;
        value.text_ = std::string(word);
        return;
      }
    }
    expect(false, "expected a value");
  }

  std::string parse_number() {
    const size_t begin = pos_;
    while (pos_ < text_.size() &&
           std::string_view("+-0123456789.eE").find(text_[pos_]) != std::string_view::npos) {
      ++pos_;
    }
    return std::string(text_.substr(begin, pos_ - begin));
  }

  // Tensor names are ASCII in practice; \u escapes (four hex digits) are decoded to UTF-8
  // (surrogate pairs included) so that any name round-trips.
  std::string parse_string() {
    consume('"');
    std::string out;
    while (true) {
      expect(pos_ < text_.size(), "unterminated string");
      const char c = text_[pos_++];
      if (c == '"') {
        return out;
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      expect(pos_ < text_.size(), "unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u':
          append_utf8(out, parse_code_point());
          break;
        default:
          expect(false, "unknown escape");
      }
    }
  }

  uint32_t parse_hex4() {
    expect(pos_ + 4 <= text_.size(), "short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v |= h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v |= h - 'A' + 10;
      } else {
        expect(false, "bad hex digit");
      }
    }
    return v;
  }

  uint32_t parse_code_point() {
    const uint32_t high = parse_hex4();
    if (high < 0xD800 || high > 0xDBFF) {
      return high;
    }
    expect(text_.substr(pos_, 2) == "\\u", "lone surrogate");
    pos_ += 2;
    const uint32_t low = parse_hex4();
    expect(low >= 0xDC00 && low <= 0xDFFF, "bad surrogate pair");
    return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  std::string_view text_;
  const std::string& what_;
  size_t pos_ = 0;
  // The keys whose values are being parsed, outermost first, to name where a key repeats.
  std::vector<const std::string*> enclosing_;
};

JsonValue JsonValue::parse(std::string_view text, const std::string& what) {
  return Parser(text, what).document();
}

const std::string& JsonValue::as_string(const std::string& what) const {
  TORCH_CHECK(kind_ == Kind::kString, "torchdefer: ", what, " must be a JSON string");
  return text_;
}

int64_t JsonValue::as_int(const std::string& what) const {
  TORCH_CHECK(kind_ == Kind::kNumber, "torchdefer: ", what, " must be a JSON integer");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text_.c_str(), &end, 10);
  TORCH_CHECK(errno == 0 && end == text_.c_str() + text_.size(), "torchdefer: ", what,
              " must be an integer that fits 64 bits, got ", text_);
  return static_cast<int64_t>(v);
}

const std::vector<JsonValue>& JsonValue::as_array(const std::string& what) const {
  TORCH_CHECK(kind_ == Kind::kArray, "torchdefer: ", what, " must be a JSON array");
  return array_;
}

const std::map<std::string, JsonValue>& JsonValue::as_object(const std::string& what) const {
  TORCH_CHECK(kind_ == Kind::kObject, "torchdefer: ", what, " must be a JSON object");
  return object_;
}

const JsonValue* JsonValue::find(const std::string& key) const {
  const auto it = object_.find(key);
  return it == object_.end() ? nullptr : &it->second;
}

}  // namespace torchdefer::detail
