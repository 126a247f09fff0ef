#include "loom/value.hpp"

#include <gtest/gtest.h>

#include "loom/core/config.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

TEST(Value, MapKeepsInsertionOrderAndReplacesInPlace) {
  Value m = Value::map();
  m.set("b", 1);
  m.set("a", 2);
  m.set("b", 3);
  ASSERT_EQ(m.as_map().size(), 2u);
  EXPECT_EQ(m.as_map()[0].first, "b");
  EXPECT_EQ(m.as_map()[0].second.as_int(), 3);
  EXPECT_EQ(m.as_map()[1].first, "a");
}

TEST(Value, TypedAccessNamesTheLocationOnMismatch) {
  Value v("abc");
  v.set_location({"x.yaml", 3, 7});
  try {
    v.as_int();
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "x.yaml:3:7: expected an integer, got \"abc\"");
  }
  EXPECT_DOUBLE_EQ(Value(3).as_double(), 3.0);  // integers are numbers
}

TEST(Value, YamlRoundTripsThroughTheLoader) {
  Value m = Value::map();
  m.set("rate", 3e-4);
  m.set("whole", 2.0);
  m.set("name", "true");  // must stay a string
  m.set("empty", "");
  m.set("list", Value(Value::List{1, 2.5, "x"}));
  Value inner = Value::map();
  inner.set("k", Value());
  m.set("inner", inner);
  const Value back = config::load_string(m.to_yaml(), "roundtrip.yaml");
  EXPECT_TRUE(back == m) << m.to_yaml() << "\nread back as\n" << back.to_yaml();
}

TEST(Value, AtPathWalksMaps) {
  Value root = config::load_string("a:\n  b:\n    c: 5\n", "t.yaml");
  ASSERT_NE(root.at_path("a.b.c"), nullptr);
  EXPECT_EQ(root.at_path("a.b.c")->as_int(), 5);
  EXPECT_EQ(root.at_path("a.x.c"), nullptr);
}

TEST(ClosestMatch, SuggestsTyposOnly) {
  EXPECT_EQ(closest_match("learning_rat", {"learning_rate", "weight_decay"}), "learning_rate");
  EXPECT_EQ(closest_match("gtp2", {"gpt2", "llama"}), "gpt2");
  EXPECT_EQ(closest_match("zzzzzz", {"gpt2", "llama"}), "");
}

}  // namespace
}  // namespace loom
