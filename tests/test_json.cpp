// The JSON values the harness writes (results) and reads (a capture's manifest.json): whatever a
// value holds, what is written is valid JSON that reads back as the same value, and a malformed
// document raises an Error naming where it breaks.
#include <cmath>
#include <limits>
#include <string>

#include "common.hpp"
#include "json.hpp"

namespace twell::test {
namespace {

using testing::Json;
using testing::parse_json;

Json parse(const std::string& text) { return parse_json(text, "test", "document"); }

TEST(Json, StringsAreEscapedAndReadBack) {
  const std::string nasty = std::string("quote \" backslash \\ newline \n tab \t cr \r nul ") + '\0' +
                            " bell \x07 del \x7f unicode \xc3\xa9 \xf0\x9f\x98\x80 slash /";
  const std::string written = Json(nasty).dump();
  EXPECT_EQ(written.find('\n'), std::string::npos) << written;
  EXPECT_EQ(written.find('\0'), std::string::npos);
  EXPECT_NE(written.find("\\u0000"), std::string::npos) << written;
  EXPECT_NE(written.find("\\u0007"), std::string::npos) << written;
  EXPECT_EQ(parse(written).text(), nasty);
  Json o = Json::object();
  o.set(nasty, Json(1));  // member names too
  EXPECT_EQ(parse(o.dump()).members().at(0).first, nasty);
}

TEST(Json, BytesThatAreNotUtf8BecomeTheReplacementCharacter) {
  for (const std::string bad : {"\xff", "\xc3", "\xc0\xaf" /* overlong '/' */, "\xed\xa0\x80" /* a surrogate */,
                                "\xf4\x90\x80\x80" /* past U+10FFFF */, "\x80"}) {
    const std::string written = Json("a" + bad + "b").dump();
    EXPECT_NE(written.find("\\ufffd"), std::string::npos) << written;
    EXPECT_EQ(parse(written).text().substr(0, 1), "a");
  }
}

TEST(Json, NonFiniteNumbersAreNull) {
  EXPECT_EQ(Json::number(std::numeric_limits<double>::infinity(), "%.3f").dump(), "null");
  EXPECT_EQ(Json::number(-std::numeric_limits<double>::infinity()).dump(), "null");
  EXPECT_EQ(Json::number(std::nan("")).dump(), "null");
  EXPECT_EQ(Json::number(1.5, "%.3f").dump(), "1.500");
  EXPECT_EQ(Json::number(1e300, "%.4f").dump().size(), 306u);  // every digit, no truncation
  EXPECT_EQ(Json(int64_t(-7)).dump(), "-7");
  EXPECT_EQ(Json(true).dump(), "true");
  // What Python's json module writes for non-finite floats, and numbers past double's range.
  const Json doc = parse("{\"a\": NaN, \"b\": Infinity, \"c\": -Infinity, \"d\": 1e999, \"e\": -0.25e-3}");
  for (const char* k : {"a", "b", "c", "d"}) EXPECT_TRUE(doc[k].is_null()) << k;
  EXPECT_EQ(doc["e"].text(), "-0.25e-3");
  EXPECT_EQ(doc.dump(), "{\"a\": null, \"b\": null, \"c\": null, \"d\": null, \"e\": -0.25e-3}");
}

TEST(Json, DocumentsReadBackAsWritten) {
  Json row = Json::object();
  row.set("s", "x").set("n", Json::number(0.5, "%.2f")).set("list", Json::array({Json(1), Json(), Json(false)}));
  Json nested = Json::object();
  nested.set("k", Json::array());
  row.set("nested", nested).set("s", "replaced");  // set keeps the first position
  const std::string text = row.dump();
  EXPECT_EQ(text, "{\"s\": \"replaced\", \"n\": 0.50, \"list\": [1, null, false], \"nested\": {\"k\": []}}");
  EXPECT_EQ(parse(text).dump(), text);
  EXPECT_EQ(parse(" \n[ ]\t").dump(), "[]");
  EXPECT_EQ(parse("\"\\u00e9\\ud83d\\ude00\\/\"").text(), "\xc3\xa9\xf0\x9f\x98\x80/");
  EXPECT_EQ(parse("\"\\ud800x\"").text(), "\xef\xbf\xbdx");  // a lone surrogate
  EXPECT_TRUE(parse("[1]")[size_t(5)].is_null());
  EXPECT_TRUE(parse("1")["key"].is_null());
}

TEST(Json, MalformedDocumentsRaiseNamingTheOffset) {
  const char* bad[] = {"",          "{",           "[1,]",       "{\"a\" 1}",     "{\"a\": 1,}", "\"open",
                       "\"tab\tin\"", "\"\\x\"",     "\"\\u12g4\"", "01",           "1.",          "-",
                       "1e",        "tru",         "[1] 2",      "{1: 2}",        "nan",         "'single'"};
  for (const char* text : bad) {
    try {
      parse(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "document") << text;
      EXPECT_NE(e.expected().find("at byte"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(parse(std::string(64, '[') + std::string(64, ']')));
  expect_named_error([] { parse(std::string(100000, '[')); }, "document", "levels deep");
}

// A member name twice in one object is refused (Python's json module keeps the last, this reader
// kept the first position with the last value): which one a reader sees is no longer a question.
// Names may repeat across objects, and an object of many members reads in one pass over them.
TEST(Json, AMemberNameTwiceInAnObjectRaises) {
  for (const char* text : {"{\"a\": 1, \"a\": 2}", "{\"a\": 1, \"b\": {\"c\": 1}, \"a\": 1}",
                           "[{\"x\": {\"a\": 1, \"b\": 2, \"a\": 3}}]", "{\"\\u0061\": 1, \"a\": 2}"}) {
    try {
      parse(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "document") << text;
      EXPECT_NE(e.expected().find("at byte"), std::string::npos) << e.what();
      EXPECT_NE(e.actual().find("\"a\" again"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse("{\"a\": {\"a\": 1}, \"b\": [{\"a\": 2}, {\"a\": 3}]}")["b"][size_t(1)]["a"].text(), "3");
  std::string many = "{";
  for (int i = 0; i < 50000; ++i) many += (i ? ", \"" : "\"") + std::to_string(i) + "\": " + std::to_string(i);
  const Json doc = parse(many + "}");
  ASSERT_EQ(doc.members().size(), 50000u);
  EXPECT_EQ(doc["49999"].text(), "49999");
  expect_named_error([&] { parse(many + ", \"17\": 0}"); }, "document", "\"17\" again");
}

// A document holds at most max_values values (members and items, nested ones included): a small
// file of many values cannot take memory far beyond its size.
TEST(Json, DocumentsOfTooManyValuesRaise) {
  std::string items = "[";
  for (int i = 0; i < 1000; ++i) items += i ? ",0" : "0";
  items += "]";
  EXPECT_EQ(parse_json(items, "test", "document", 1001).items().size(), 1000u);  // the array and its items
  expect_named_error([&] { parse_json(items, "test", "document", 1000); }, "document", "at most 1000 values");
  expect_named_error([&] { parse_json("{\"a\": [1, {\"b\": 2}]}", "test", "document", 4); }, "document",
                     "at most 4 values");
  EXPECT_NO_THROW(parse_json("{\"a\": [1, {\"b\": 2}]}", "test", "document", 5));
  std::string past_default = "[0";  // the array and kMaxJsonValues items
  for (size_t i = 1; i < testing::kMaxJsonValues; ++i) past_default += ",0";
  expect_named_error([&] { parse(past_default + "]"); }, "document", "values");
}

TEST(Json, SetAndPushNeedTheirKind) {
  Json a = Json::array();
  expect_named_error([&] { a.set("k", Json(1)); }, "k", "an object");
  Json o = Json::object();
  expect_named_error([&] { o.push(Json(1)); }, "item", "an array");
}

}  // namespace
}  // namespace twell::test
