// Text inside the report's HTML and SVG, and bytes from a run's files in messages.
#pragma once

#include <string>

namespace loom {

// &, <, >, " and ' as entities: safe in element text and in quoted attributes.
inline std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// 0xFF.
inline std::string hex_byte(unsigned char c) {
  const char* const digits = "0123456789ABCDEF";
  return std::string("0x") + digits[c >> 4] + digits[c & 15];
}

// Printable ASCII as it is, every other byte as \xNN: a file's bytes quoted in an error message
// never put raw binary or broken UTF-8 on the user's terminal.
inline std::string printable(const std::string& text) {
  const char* const digits = "0123456789abcdef";
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += digits[c >> 4];
      out += digits[c & 15];
    }
  }
  return out;
}

}  // namespace loom
