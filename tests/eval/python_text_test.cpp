// Python's str methods that lm-evaluation-harness applies to task documents (python_text.hpp),
// against CPython 3.11: a list of cases CPython gives (full case mappings, final sigma, Unicode
// whitespace), and, where Debian's /usr/bin/python3 is there, every code point.
#include "../../core/run/src/eval/python_text.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "loom/utf8.hpp"
#include "reference_required.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace loom::eval::python {
namespace {

// {text, text.capitalize()}: CPython 3.11
const std::vector<std::pair<std::string, std::string>> kCapitalize = {
    {"\u00e9lan", "\u00c9lan"},
    {"the \u00dcBER", "The \u00fcber"},
    {"\u00df", "Ss"},
    {"\u00dftra\u00dfe", "Sstra\u00dfe"},
    {"\u01c6emal", "\u01c5emal"},
    {"\u01c5", "\u01c5"},
    {"\ufb01ne", "Fine"},
    {"\u0149", "\u02bcN"},
    {"\u0130stanbul", "\u0130stanbul"},
    {"\u0130STANBUL", "\u0130stanbul"},
    {"\u0391\u03a3", "\u0391\u03c2"},
    {"\u0391\u03a3 \u0391", "\u0391\u03c2 \u03b1"},
    {"\u0391\u03a3.", "\u0391\u03c2."},
    {"\u03a3", "\u03a3"},
    {"\u0391\u03a3'\u0391", "\u0391\u03c3'\u03b1"},
    {"\u0391\u02b0\u03a3", "\u0391\u02b0\u03c2"},
    {"\u1f52", "\u03a5\u0313\u0300"},
    {"\u1fb3", "\u1fbc"},
    {"\u03a3\u0391\u03a3 \u03a3\u0391\u03a3\u0391", "\u03a3\u03b1\u03c2 \u03c3\u03b1\u03c3\u03b1"},
    {"A\u0307\u03a3\u0301", "A\u0307\u03c2\u0301"},
    {"\u01f0", "J\u030c"},
    {"hELLO wORLD", "Hello world"},
    {"\u24d0\u24d1", "\u24b6\u24d1"},
    {"\u2177\u2167", "\u2167\u2177"},
    {"\u24b6", "\u24b6"},
    {"\ua7b5", "\ua7b4"},
    {"123 ABC", "123 abc"},
    {"", ""},
    {" \u00e9lan", " \u00e9lan"},
    {"\u00a0x", "\u00a0x"},
    {"\u01f1 \u01f2 \u01f3", "\u01f2 \u01f3 \u01f3"},
    {"\U00010428\U00010400", "\U00010400\U00010428"},
};
// {text, text.strip(), len(text.rstrip().encode())}: CPython 3.11
const std::vector<std::tuple<std::string, std::string, std::size_t>> kStrip = {
    {"\u00a0 x \u3000", "x", 4},
    {"\u2028y\u2029", "y", 4},
    {"\u0085z\u1680", "z", 3},
    {"\u200bq\u200b", "\u200bq\u200b", 7},
    {"\u180ex", "\u180ex", 4},
    {"\u2000\u200a\u202f\u205fw\u00a0", "w", 13},
    {"\x1c"
     "\x1f"
     " a \x0b"
     "\x0c"
     "",
     "a", 4},
    {"\u2003end\u2003", "end", 6},
};
// {text, len(re.split(r"\s+", text))}: CPython 3.11
const std::vector<std::pair<std::string, std::size_t>> kSplit = {
    {"one two", 2}, {"a\u3000b\u00a0c", 3}, {"x\u2028\u2029y", 2},        {"\u200bz", 1}, {"  lead", 2}, {"trail  ", 2},
    {"", 1},        {"a\u0085b\u180ec", 2}, {"p\u2003q\u3000\u3000r", 3},
};

TEST(EvalPythonText, CasesAsCPythonGivesThem) {
  for (const auto& [text, expected] : kCapitalize) EXPECT_EQ(capitalize(text), expected) << text;
  for (const auto& [text, stripped, rstripped] : kStrip) {
    EXPECT_EQ(strip(text), stripped) << text;
    EXPECT_EQ(rstrip_size(text), rstripped) << text;
  }
  for (const auto& [text, words] : kSplit) EXPECT_EQ(split_count(text), words) << text;
  EXPECT_EQ(length("y\u00e9\U0001F600"), 3u);
}

// Every code point c: c.capitalize(), ("a" + c).capitalize()[1:] (its lowercase), whether
// (c + "Σ").lower() and ("A" + c + "Σ").lower() end in a final sigma (whether c is cased, and
// case-ignorable, to the Final_Sigma rule), and c.isspace().
constexpr const char* kProbe = R"(import sys
out = open(sys.argv[1], "w")
for cp in range(0x110000):
    if 0xD800 <= cp <= 0xDFFF:
        continue
    c = chr(cp)
    hexes = lambda s: ",".join("%x" % ord(x) for x in s)
    out.write("%x %s %s %d %d %d\n" % (cp, hexes(c.capitalize()), hexes(("a" + c).capitalize()[1:]),
              (c + "\u03a3").lower()[-1] == "\u03c2", ("A" + c + "\u03a3").lower()[-1] == "\u03c2", c.isspace()))
)";

std::string hexes(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const Utf8Char c = decode_utf8(text, i);
    std::ostringstream os;
    os << std::hex << static_cast<std::uint32_t>(c.code_point);
    out += (out.empty() ? "" : ",") + os.str();
    i += c.length;
  }
  return out;
}

bool ends_in_final_sigma(const std::string& text) {
  return text.size() >= 2 && text.substr(text.size() - 2) == "\u03c2";
}

TEST(EvalPythonText, EveryCodePointAsCPython) {
  const fs::path python = "/usr/bin/python3";
  std::error_code ec;
  if (!fs::exists(python, ec)) return test::skip_missing_reference("no /usr/bin/python3 to compare with");
  test::TempDir dir;
  const fs::path script = dir.write("probe.py", kProbe), table = dir.path() / "table.txt";
  const auto r = test::run_command({python.string(), script.string(), table.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto version = test::run_command({python.string(), "-c", "import sys; print(sys.version_info[:2])"});
  if (version.out.find("(3, 11)") == std::string::npos)
    return test::skip_missing_reference("/usr/bin/python3 is not CPython 3.11 (Unicode 14): " + version.out);
  std::ifstream in(table);
  std::size_t rows = 0, wrong = 0;
  for (std::string line; std::getline(in, line); ++rows) {
    std::istringstream fields(line);
    std::uint32_t cp = 0;
    std::string title, lower;
    int cased = 0, after_cased = 0, space = 0;
    fields >> std::hex >> cp >> title >> lower >> std::dec >> cased >> after_cased >> space;
    std::string c;
    append_utf8(c, cp);
    const std::string got_lower = capitalize("a" + c).substr(1);
    const bool ok = hexes(capitalize(c)) == title && hexes(got_lower) == lower &&
                    ends_in_final_sigma(capitalize(c + "\u03a3")) == (cased != 0) &&
                    ends_in_final_sigma(capitalize("A" + c + "\u03a3")) == (after_cased != 0) &&
                    is_space(cp) == (space != 0);
    if (!ok && ++wrong <= 20) ADD_FAILURE() << "U+" << std::hex << cp << ": " << line;
  }
  EXPECT_EQ(rows, 0x110000u - 0x800u);
  EXPECT_EQ(wrong, 0u);
}

}  // namespace
}  // namespace loom::eval::python
