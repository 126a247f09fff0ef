// Python 3.11's str methods on UTF-8: see python_text.hpp. utf8proc gives the code points, their
// categories and the simple case mappings; CPython's full mappings and its Final_Sigma rule are
// here. tests/eval/python_text_test.cpp compares every code point with CPython 3.11.
#include "python_text.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <span>
#include <vector>

namespace loom::eval::python {

namespace {

struct FullMapping {
  char32_t from;
  std::array<char32_t, 3> to;  // ends at the first 0
};

// SpecialCasing.txt's unconditional titlecase mappings of more than one code point (Unicode 14,
// as CPython 3.11's _PyUnicode_ToTitleFull gives them); every other titlecase is utf8proc's simple one.
constexpr FullMapping kTitle[] = {
    {0x00DF, {0x0053, 0x0073}},         {0x0149, {0x02BC, 0x004E}},         {0x01F0, {0x004A, 0x030C}},
    {0x0390, {0x0399, 0x0308, 0x0301}}, {0x03B0, {0x03A5, 0x0308, 0x0301}}, {0x0587, {0x0535, 0x0582}},
    {0x1E96, {0x0048, 0x0331}},         {0x1E97, {0x0054, 0x0308}},         {0x1E98, {0x0057, 0x030A}},
    {0x1E99, {0x0059, 0x030A}},         {0x1E9A, {0x0041, 0x02BE}},         {0x1F50, {0x03A5, 0x0313}},
    {0x1F52, {0x03A5, 0x0313, 0x0300}}, {0x1F54, {0x03A5, 0x0313, 0x0301}}, {0x1F56, {0x03A5, 0x0313, 0x0342}},
    {0x1FB2, {0x1FBA, 0x0345}},         {0x1FB4, {0x0386, 0x0345}},         {0x1FB6, {0x0391, 0x0342}},
    {0x1FB7, {0x0391, 0x0342, 0x0345}}, {0x1FC2, {0x1FCA, 0x0345}},         {0x1FC4, {0x0389, 0x0345}},
    {0x1FC6, {0x0397, 0x0342}},         {0x1FC7, {0x0397, 0x0342, 0x0345}}, {0x1FD2, {0x0399, 0x0308, 0x0300}},
    {0x1FD3, {0x0399, 0x0308, 0x0301}}, {0x1FD6, {0x0399, 0x0342}},         {0x1FD7, {0x0399, 0x0308, 0x0342}},
    {0x1FE2, {0x03A5, 0x0308, 0x0300}}, {0x1FE3, {0x03A5, 0x0308, 0x0301}}, {0x1FE4, {0x03A1, 0x0313}},
    {0x1FE6, {0x03A5, 0x0342}},         {0x1FE7, {0x03A5, 0x0308, 0x0342}}, {0x1FF2, {0x1FFA, 0x0345}},
    {0x1FF4, {0x038F, 0x0345}},         {0x1FF6, {0x03A9, 0x0342}},         {0x1FF7, {0x03A9, 0x0342, 0x0345}},
    {0xFB00, {0x0046, 0x0066}},         {0xFB01, {0x0046, 0x0069}},         {0xFB02, {0x0046, 0x006C}},
    {0xFB03, {0x0046, 0x0066, 0x0069}}, {0xFB04, {0x0046, 0x0066, 0x006C}}, {0xFB05, {0x0053, 0x0074}},
    {0xFB06, {0x0053, 0x0074}},         {0xFB13, {0x0544, 0x0576}},         {0xFB14, {0x0544, 0x0565}},
    {0xFB15, {0x0544, 0x056B}},         {0xFB16, {0x054E, 0x0576}},         {0xFB17, {0x0544, 0x056D}},
};

struct Range {
  char32_t first, last;
};

// DerivedCoreProperties' Other_Lowercase and Other_Uppercase (Unicode 14): cased, though not of
// category Lu, Ll or Lt.
constexpr Range kOtherCased[] = {
    {0x00AA, 0x00AA},   {0x00BA, 0x00BA},   {0x02B0, 0x02B8},   {0x02C0, 0x02C1},   {0x02E0, 0x02E4},
    {0x0345, 0x0345},   {0x037A, 0x037A},   {0x10FC, 0x10FC},   {0x1D2C, 0x1D6A},   {0x1D78, 0x1D78},
    {0x1D9B, 0x1DBF},   {0x2071, 0x2071},   {0x207F, 0x207F},   {0x2090, 0x209C},   {0x2160, 0x217F},
    {0x24B6, 0x24E9},   {0x2C7C, 0x2C7D},   {0xA69C, 0xA69D},   {0xA770, 0xA770},   {0xA7F8, 0xA7F9},
    {0xAB5C, 0xAB5F},   {0x10780, 0x10780}, {0x10783, 0x10785}, {0x10787, 0x107B0}, {0x107B2, 0x107BA},
    {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189},
};

// Word_Break MidLetter, MidNumLet and Single_Quote: case-ignorable whatever their category.
constexpr char32_t kIgnorablePunctuation[] = {0x0027, 0x002E, 0x003A, 0x00B7, 0x0387, 0x055F, 0x05F4, 0x2018, 0x2019,
                                              0x2024, 0x2027, 0xFE13, 0xFE52, 0xFE55, 0xFF07, 0xFF0E, 0xFF1A};

// Characters Unicode 15 (utf8proc 2.8) assigned that Unicode 14 (CPython 3.11) has not: neither
// cased nor case-ignorable to CPython.
constexpr Range kUnassignedIn14[] = {
    {0x0ECE, 0x0ECE},   {0x10EFD, 0x10EFF}, {0x11241, 0x11241}, {0x11F00, 0x11F01}, {0x11F36, 0x11F3A},
    {0x11F40, 0x11F40}, {0x11F42, 0x11F42}, {0x13439, 0x13440}, {0x13447, 0x13455}, {0x1DF25, 0x1DF2A},
    {0x1E030, 0x1E06D}, {0x1E08F, 0x1E08F}, {0x1E4EB, 0x1E4EF},
};

bool in(std::span<const Range> ranges, char32_t c) {
  return std::any_of(ranges.begin(), ranges.end(), [c](const Range& r) { return c >= r.first && c <= r.last; });
}

// Unicode's Cased and Case_Ignorable, as Final_Sigma reads them.
bool is_cased(char32_t c) {
  if (in(kUnassignedIn14, c)) return false;
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT ||
         in(kOtherCased, c);
}

bool is_case_ignorable(char32_t c) {
  if (in(kUnassignedIn14, c)) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
      return true;
    default:
      return std::find(std::begin(kIgnorablePunctuation), std::end(kIgnorablePunctuation), c) !=
             std::end(kIgnorablePunctuation);
  }
}

std::vector<char32_t> decode(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    utf8proc_int32_t c = 0;
    const auto n = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(text.size() - i), &c);
    if (n <= 0) {  // not reached for valid UTF-8: the byte as itself
      out.push_back(p[i]);
      ++i;
      continue;
    }
    out.push_back(static_cast<char32_t>(c));
    i += static_cast<std::size_t>(n);
  }
  return out;
}

void append(std::string& out, char32_t c) {
  utf8proc_uint8_t buffer[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buffer);
  out.append(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(n));
}

// CPython's handle_capital_sigma: U+03A3 lowercases to final sigma after a cased letter (case-
// ignorable ones between) and not before one.
char32_t lower_sigma(const std::vector<char32_t>& s, std::size_t i) {
  std::size_t j = i;
  while (j > 0 && is_case_ignorable(s[j - 1])) --j;
  bool final_sigma = j > 0 && is_cased(s[j - 1]);
  if (final_sigma) {
    std::size_t k = i + 1;
    while (k < s.size() && is_case_ignorable(s[k])) ++k;
    final_sigma = k == s.size() || !is_cased(s[k]);
  }
  return final_sigma ? 0x03C2 : 0x03C3;
}

}  // namespace

bool is_space(char32_t c) {
  // Py_UNICODE_ISSPACE: bidirectional class WS, B or S, or category Zs.
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string strip(std::string_view text) {
  const std::vector<char32_t> s = decode(text);
  std::size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  std::string out;
  for (std::size_t i = b; i < e; ++i) append(out, s[i]);
  return out;
}

std::size_t rstrip_size(std::string_view text) {
  std::size_t end = 0;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  for (std::size_t i = 0; i < text.size();) {
    utf8proc_int32_t c = 0;
    auto n = utf8proc_iterate(p + i, static_cast<utf8proc_ssize_t>(text.size() - i), &c);
    if (n <= 0) n = 1, c = p[i];
    i += static_cast<std::size_t>(n);
    if (!is_space(static_cast<char32_t>(c))) end = i;
  }
  return end;
}

std::string capitalize(std::string_view text) {
  const std::vector<char32_t> s = decode(text);
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (i == 0) {
      const auto full =
          std::find_if(std::begin(kTitle), std::end(kTitle), [c](const FullMapping& m) { return m.from == c; });
      if (full != std::end(kTitle)) {
        for (const char32_t t : full->to)
          if (t != 0) append(out, t);
      } else {
        append(out, static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))));
      }
    } else if (c == 0x0130) {  // SpecialCasing's one unconditional lowercase of two code points
      append(out, 0x0069);
      append(out, 0x0307);
    } else if (c == 0x03A3) {
      append(out, lower_sigma(s, i));
    } else {
      append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

std::size_t split_count(std::string_view text) {
  std::size_t words = 1;
  bool in_space = false;
  for (const char32_t c : decode(text)) {
    const bool space = is_space(c);
    if (space && !in_space) ++words;
    in_space = space;
  }
  return words;
}

std::size_t length(std::string_view text) {
  std::size_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

}  // namespace loom::eval::python
