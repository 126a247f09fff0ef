// GPT-2's byte symbols: the reversible map from the 256 byte values to printable Unicode
// characters that vocabulary files are written in (OpenAI's `bytes_to_unicode`). Printable
// Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7F-0xA0, 0xAD) take
// U+0100 onwards in byte order, so the space byte is written 'Ġ' (U+0120).
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace loom::gpt2_bpe {

inline constexpr std::array<char32_t, 256> kByteToUnicode = [] {
  std::array<char32_t, 256> table{};
  const auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[static_cast<std::size_t>(b)] = printable(b) ? static_cast<char32_t>(b) : next++;
  return table;
}();

// The byte a symbol stands for, or -1 when `cp` is not one of the 256 byte symbols.
inline int unicode_to_byte(char32_t cp) {
  if (cp < 256) return kByteToUnicode[cp] == cp ? static_cast<int>(cp) : -1;
  if (cp >= 256 + 68) return -1;
  for (int b = 0; b < 256; ++b)
    if (kByteToUnicode[static_cast<std::size_t>(b)] == cp) return b;
  return -1;
}

// A vocabulary entry's text ("Ġthe") as the raw bytes it stands for (" the"). Returns false,
// leaving `bytes` unspecified, when `symbols` is not valid UTF-8 or holds a character that is not
// a byte symbol; `bad` is then that character (or U+FFFD for invalid UTF-8).
bool symbols_to_bytes(std::string_view symbols, std::string& bytes, char32_t& bad);

// The inverse: raw bytes as byte symbols, as vocabulary files write them.
std::string bytes_to_symbols(std::string_view bytes);

}  // namespace loom::gpt2_bpe
