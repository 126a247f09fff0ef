// Unicode normalization form C (NFC), the normalizer of Qwen 2's tokenizer.json: canonical
// decomposition, then canonical composition ("e" + U+0301 becomes "é"). Done by utf8proc (Debian's
// libutf8proc: a small C library that works on UTF-8 directly and follows Unicode 15, where ICU
// would need a round trip through UTF-16 and a much larger dependency).
#pragma once

#include <string>
#include <string_view>

namespace loom::gpt2_bpe {

// `text` in NFC. Bytes that are not UTF-8 are kept as they are; the valid text on either side of
// them is normalized on its own.
std::string nfc(std::string_view text);

}  // namespace loom::gpt2_bpe
