// Python 3.11's str methods that lm-evaluation-harness's task code applies to documents, on UTF-8
// text: str.isspace()'s whitespace (what strip(), rstrip(), split() and re's \s remove), and
// str.capitalize() with Unicode's full case mappings (the first character titlecased, "ß" -> "Ss";
// the rest lowercased, "İ" -> "i̇", a final capital sigma -> "ς").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom::eval::python {

// str.isspace() of one code point.
bool is_space(char32_t c);

// str.strip() and the length in bytes of str.rstrip() (text must be valid UTF-8).
std::string strip(std::string_view text);
std::size_t rstrip_size(std::string_view text);

// str.capitalize() (valid UTF-8 in, UTF-8 out).
std::string capitalize(std::string_view text);

// len(re.split(r"\s+", text)): one more than the runs of whitespace.
std::size_t split_count(std::string_view text);

// len() of a str: the code points of valid UTF-8.
std::size_t length(std::string_view text);

}  // namespace loom::eval::python
