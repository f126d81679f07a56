// JSON values: the one writer of every JSON file the benchmark harness and the CLI write (results),
// and the reader of a capture's manifest.json. What is written is always valid JSON (RFC 8259):
// strings escaped (quotes, backslashes, control characters; bytes that are not UTF-8 become
// U+FFFD) and non-finite numbers written as null, whatever a value holds.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace twell::testing {

class Json {
 public:
  enum class Kind : uint8_t { null, boolean, number, string, array, object };

  Json() = default;  // null
  Json(bool b) : kind_(Kind::boolean), text_(b ? "true" : "false") {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Json(T v) : kind_(Kind::number), text_(std::to_string(v)) {}
  Json(std::string s) : kind_(Kind::string), text_(std::move(s)) {}
  Json(const char* s) : Json(std::string(s)) {}
  // A number as printf's `format` (one double conversion, e.g. "%.4f") writes it; NaN and
  // infinities are null.
  static Json number(double v, const char* format = "%.17g");
  static Json array(std::vector<Json> items = {});
  static Json object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  // A string's value, a number's JSON text, "true" / "false"; empty otherwise.
  const std::string& text() const { return text_; }
  const std::vector<Json>& items() const { return items_; }  // an array's
  const std::vector<std::pair<std::string, Json>>& members() const { return members_; }  // an object's

  // An object's member `key` (null when absent or not an object), or an array's item i (null
  // past its end or not an array).
  const Json& operator[](const std::string& key) const;
  const Json& operator[](size_t i) const;
  // Adds member `key` to an object, or replaces its value in place (members keep the order of
  // their first set); returns *this. Error on another kind of value (push: on all but an array).
  // Lookups and set search the members in order: meant for the few members of a result row
  // (parse_json builds objects without set).
  Json& set(const std::string& key, Json value);
  Json& push(Json item);  // appends to an array; returns *this

  // The value on one line: `{"a": 1, "b": [true, null]}`.
  std::string dump() const;

 private:
  friend class JsonReader;  // json.cpp: keeps a number's text as the document writes it
  Kind kind_ = Kind::null;
  std::string text_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

// The JSON value `text` holds (whitespace around it only). NaN, Infinity and -Infinity, which
// Python's json module writes for non-finite floats, and numbers beyond double's range read as
// null. Throws Error(op, what, ...) naming the first flaw and its byte offset: malformed JSON, a
// member name twice in one object (Python's json keeps the last; here neither is picked),
// nesting deeper than 64 levels, or more than max_values values (the document, its members and
// items, nested ones included; a small text of many values cannot take memory far beyond its
// size). Reading takes O(n log n) time at worst (names checked against a tree per object).
constexpr size_t kMaxJsonValues = size_t(1) << 20;
Json parse_json(const std::string& text, const char* op, const std::string& what,
                size_t max_values = kMaxJsonValues);

}  // namespace twell::testing
