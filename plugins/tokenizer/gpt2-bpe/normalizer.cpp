#include "normalizer.hpp"

#include <utf8proc.h>

#include <cstdlib>
#include <loom/error.hpp>

#include "loom/utf8.hpp"

namespace loom::gpt2_bpe {

namespace {

void append_nfc(std::string& out, std::string_view valid) {
  // ASCII is its own NFC, and most text is mostly ASCII: copy up to the last ASCII byte before
  // the first other one (a combining mark may attach to that byte).
  std::size_t ascii = 0;
  while (ascii < valid.size() && static_cast<unsigned char>(valid[ascii]) < 0x80) ++ascii;
  if (ascii == valid.size()) {
    out += valid;
    return;
  }
  if (ascii > 0) --ascii;
  out += valid.substr(0, ascii);
  valid.remove_prefix(ascii);
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()), static_cast<utf8proc_ssize_t>(valid.size()),
                   &result, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    std::free(result);
    throw InternalError(std::string("gpt2-bpe: NFC normalization failed: ") + utf8proc_errmsg(n));
  }
  out.append(reinterpret_cast<const char*>(result), static_cast<std::size_t>(n));
  std::free(result);
}

}  // namespace

std::string nfc(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t valid_end = valid_utf8_end(text, pos);
    if (valid_end > pos) append_nfc(out, text.substr(pos, valid_end - pos));
    pos = valid_end;
    if (pos < text.size()) {
      const std::size_t invalid_end = invalid_utf8_end(text, pos);
      out += text.substr(pos, invalid_end - pos);
      pos = invalid_end;
    }
  }
  return out;
}

}  // namespace loom::gpt2_bpe
