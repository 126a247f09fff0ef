#include "byte_level.hpp"

#include "loom/utf8.hpp"

namespace loom::gpt2_bpe {

bool symbols_to_bytes(std::string_view symbols, std::string& bytes, char32_t& bad) {
  bytes.clear();
  for (std::size_t i = 0; i < symbols.size();) {
    const Utf8Char c = decode_utf8(symbols, i);
    if (c.length == 0) {
      bad = 0xFFFD;
      return false;
    }
    const int b = unicode_to_byte(c.code_point);
    if (b < 0) {
      bad = c.code_point;
      return false;
    }
    bytes.push_back(static_cast<char>(b));
    i += c.length;
  }
  return true;
}

std::string bytes_to_symbols(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_utf8(out, kByteToUnicode[b]);
  return out;
}

}  // namespace loom::gpt2_bpe
