// Strict UTF-8 decoding for tokenizers: what Python's decoder accepts, and nothing
// more (no overlong forms, no surrogates, nothing above U+10FFFF).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom {

struct Utf8Char {
  char32_t code_point;
  std::size_t length;  // 0: the bytes at this position are not valid UTF-8
};

inline Utf8Char decode_utf8(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return {b0, 1};
  std::size_t length;
  char32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    length = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {0, 0};
  }
  if (i + length > text.size()) return {0, 0};
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {0, 0};
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {0, 0};
  return {cp, length};
}

// The end of the longest valid UTF-8 prefix of text[pos...]. ASCII is checked eight bytes at a
// time: corpora are mostly ASCII, and this runs over every byte encoded.
inline std::size_t valid_utf8_end(std::string_view text, std::size_t pos) {
  const char* data = text.data();
  const std::size_t n = text.size();
  while (pos < n) {
    while (pos + 8 <= n) {
      unsigned long long word;
      __builtin_memcpy(&word, data + pos, 8);
      if (word & 0x8080808080808080ULL) break;
      pos += 8;
    }
    if (pos >= n) break;
    if (static_cast<unsigned char>(data[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Char c = decode_utf8(text, pos);
    if (c.length == 0) return pos;
    pos += c.length;
  }
  return n;
}

// The end of the run of bytes at `pos` that are not valid UTF-8 (at least one byte).
inline std::size_t invalid_utf8_end(std::string_view text, std::size_t pos) {
  ++pos;
  while (pos < text.size() && decode_utf8(text, pos).length == 0) ++pos;
  return pos;
}

inline void append_utf8(std::string& out, char32_t cp) {
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

}  // namespace loom
