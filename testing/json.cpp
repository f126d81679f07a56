#include "json.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "twell/error.hpp"

namespace twell::testing {

namespace {

constexpr int kMaxDepth = 64;

const Json& null_value() {
  static const Json n;
  return n;
}

// The length (1..4) of the UTF-8 sequence at s[i], or 0 where the bytes there are not one (a stray
// continuation byte, a truncated or overlong sequence, a surrogate, a code point past U+10FFFF).
size_t utf8_length(const std::string& s, size_t i) {
  const auto byte = [&s](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1fu;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0fu;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07u;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0u) != 0x80u) return 0;
    cp = cp << 6 | (byte(i + k) & 0x3fu);
  }
  static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kSmallest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xc0 | cp >> 6), out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | cp >> 12), out += char(0x80 | (cp >> 6 & 0x3f)), out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | cp >> 18), out += char(0x80 | (cp >> 12 & 0x3f));
    out += char(0x80 | (cp >> 6 & 0x3f)), out += char(0x80 | (cp & 0x3f));
  }
}

void write_string(const std::string& s, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\', out += char(c), ++i;
    } else if (c < 0x20) {
      static constexpr const char* kShort[] = {"b", "t", "n", nullptr, "f", "r"};  // 0x08..0x0d
      const char* e = c >= 0x08 && c <= 0x0d ? kShort[c - 0x08] : nullptr;
      char buf[8];
      std::snprintf(buf, sizeof buf, "u%04x", unsigned(c));
      out += '\\', out += e ? e : buf, ++i;
    } else if (const size_t n = utf8_length(s, i)) {
      out.append(s, i, n), i += n;
    } else {
      out += "\\ufffd", ++i;  // not UTF-8: the replacement character
    }
  }
  out += '"';
}

void write(const Json& v, std::string& out) {
  switch (v.kind()) {
    case Json::Kind::null: out += "null"; return;
    case Json::Kind::boolean:
    case Json::Kind::number: out += v.text(); return;
    case Json::Kind::string: write_string(v.text(), out); return;
    case Json::Kind::array:
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += ", ";
        write(v.items()[i], out);
      }
      out += ']';
      return;
    case Json::Kind::object:
      out += '{';
      for (size_t i = 0; i < v.members().size(); ++i) {
        if (i) out += ", ";
        write_string(v.members()[i].first, out);
        out += ": ";
        write(v.members()[i].second, out);
      }
      out += '}';
      return;
  }
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

// A recursive-descent reader of one document, nesting limited to kMaxDepth.
class JsonReader {
 public:
  JsonReader(const std::string& text, const char* op, const std::string& what, size_t max_values)
      : s_(text), op_(op), what_(what), max_values_(max_values) {}

  Json document() {
    Json v = value(0);
    skip_space();
    if (at_ != s_.size()) fail("the end of the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    std::string got = "the end of the text";
    if (at_ < s_.size()) {
      const auto c = static_cast<unsigned char>(s_[at_]);
      char buf[16];
      std::snprintf(buf, sizeof buf, c >= 0x20 && c < 0x7f ? "'%c'" : "byte 0x%02x", c);
      got = buf;
    }
    throw Error(op_, what_, expected + " at byte " + std::to_string(at_), got);
  }
  bool more() const { return at_ < s_.size(); }
  bool next_is(char c) const { return more() && s_[at_] == c; }
  void skip_space() {
    while (more() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }
  bool take(const std::string& word) {
    if (s_.compare(at_, word.size(), word) != 0) return false;
    at_ += word.size();
    return true;
  }
  void expect(char c, const char* expected) {
    skip_space();
    if (!next_is(c)) fail(expected);
    ++at_;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nesting at most " + std::to_string(kMaxDepth) + " levels deep");
    skip_space();
    if (++values_ > max_values_)
      throw Error(op_, what_, "at most " + std::to_string(max_values_) + " values (members and items included)",
                  "more (the next at byte " + std::to_string(at_) + ")");
    if (next_is('{')) return object(depth);
    if (next_is('[')) return array(depth);
    if (next_is('"')) return Json(string());
    if (take("true")) return Json(true);
    if (take("false")) return Json(false);
    if (take("null") || take("NaN") || take("Infinity") || take("-Infinity")) return Json();
    if (next_is('-') || (more() && is_digit(s_[at_]))) return number();
    fail("a value");
  }

  Json number() {
    const size_t begin = at_;
    auto digits = [&](const char* expected) {
      if (!more() || !is_digit(s_[at_])) fail(expected);
      while (more() && is_digit(s_[at_])) ++at_;
    };
    if (next_is('-')) ++at_;
    if (next_is('0')) ++at_;
    else digits("a digit");
    if (next_is('.')) ++at_, digits("a digit after the decimal point");
    if (next_is('e') || next_is('E')) {
      ++at_;
      if (next_is('+') || next_is('-')) ++at_;
      digits("an exponent");
    }
    Json j;
    j.text_ = s_.substr(begin, at_ - begin);
    if (!std::isfinite(std::strtod(j.text_.c_str(), nullptr))) return Json();  // beyond double: null
    j.kind_ = Json::Kind::number;
    return j;
  }

  uint32_t hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i, ++at_) {
      const char c = more() ? s_[at_] : '\0';
      const int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) fail("four hex digits after \\u");
      v = v << 4 | uint32_t(d);
    }
    return v;
  }

  std::string string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (!more()) fail("a closing quote");
      const auto c = static_cast<unsigned char>(s_[at_]);
      if (c < 0x20) fail("a control character written as an escape");
      ++at_;
      if (c == '"') return out;
      if (c != '\\') {
        out += char(c);
        continue;
      }
      const char e = more() ? s_[at_] : '\0';
      static const std::string kEscapes = "\"\\/bfnrt", kMeaning = "\"\\/\b\f\n\r\t";
      if (const size_t k = kEscapes.find(e); e != '\0' && k != std::string::npos) {
        out += kMeaning[k], ++at_;
        continue;
      }
      if (e != 'u') fail("an escape: \\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX");
      ++at_;
      uint32_t cp = hex4();
      if (cp >= 0xd800 && cp <= 0xdbff && s_.compare(at_, 2, "\\u") == 0) {
        const size_t back = at_;
        at_ += 2;
        const uint32_t low = hex4();
        if (low >= 0xdc00 && low <= 0xdfff) cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
        else at_ = back;  // not a pair: the high half alone, and the next escape read on its own
      }
      append_utf8(cp >= 0xd800 && cp <= 0xdfff ? 0xfffd : cp, out);  // a lone surrogate: U+FFFD
    }
  }

  Json array(int depth) {
    ++at_;
    Json a = Json::array();
    skip_space();
    if (next_is(']')) return ++at_, a;
    while (true) {
      a.push(value(depth + 1));
      skip_space();
      if (next_is(']')) return ++at_, a;
      expect(',', "',' or ']'");
    }
  }

  // A name as an Error shows it: JSON-escaped, cut to about 80 characters.
  static std::string shown(const std::string& name) {
    const std::string s = Json(name).dump();
    return s.size() <= 80 ? s : s.substr(0, 76) + "...\"";
  }

  Json object(int depth) {
    ++at_;
    Json o = Json::object();
    std::set<std::string> names;  // the members' names so far (a tree: no input makes lookups slow)
    skip_space();
    if (next_is('}')) return ++at_, o;
    while (true) {
      skip_space();
      if (!next_is('"')) fail("a member name");
      const size_t name_at = at_;
      std::string key = string();
      if (!names.insert(key).second)
        throw Error(op_, what_, "a member name not used before in its object at byte " + std::to_string(name_at),
                    shown(key) + " again");
      expect(':', "':'");
      o.members_.emplace_back(std::move(key), value(depth + 1));
      skip_space();
      if (next_is('}')) return ++at_, o;
      expect(',', "',' or '}'");
    }
  }

  const std::string& s_;
  const char* op_;
  const std::string& what_;
  const size_t max_values_;
  size_t at_ = 0, values_ = 0;
};

Json Json::number(double v, const char* format) {
  if (!std::isfinite(v)) return Json();
  Json j;
  j.kind_ = Kind::number;
  j.text_.resize(size_t(std::snprintf(nullptr, 0, format, v)) + 1);
  j.text_.resize(size_t(std::snprintf(&j.text_[0], j.text_.size(), format, v)));
  return j;
}

Json Json::array(std::vector<Json> items) {
  Json j;
  j.kind_ = Kind::array;
  j.items_ = std::move(items);
  return j;
}

Json Json::object() {
  Json j;
  j.kind_ = Kind::object;
  return j;
}

const Json& Json::operator[](const std::string& key) const {
  for (const auto& [k, v] : members_)
    if (k == key) return v;
  return null_value();
}

const Json& Json::operator[](size_t i) const { return i < items_.size() ? items_[i] : null_value(); }

Json& Json::set(const std::string& key, Json value) {
  if (kind_ != Kind::object) throw Error("Json::set", key, "an object to set it in", "another kind of value");
  for (auto& [k, v] : members_)
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  members_.emplace_back(key, std::move(value));
  return *this;
}

Json& Json::push(Json item) {
  if (kind_ != Kind::array) throw Error("Json::push", "item", "an array to append it to", "another kind of value");
  items_.push_back(std::move(item));
  return *this;
}

std::string Json::dump() const {
  std::string out;
  write(*this, out);
  return out;
}

Json parse_json(const std::string& text, const char* op, const std::string& what, size_t max_values) {
  return JsonReader(text, op, what, max_values).document();
}

}  // namespace twell::testing
