#!/usr/bin/env python3
"""Expected GPT-2 token ids for gpt2-bpe's tests, computed independently of loom.

The encoder below is the published algorithm of OpenAI's gpt-2 repository (src/encoder.py:
bytes_to_unicode, get_pairs, Encoder.bpe with merge ranks, the pre-tokenizer regex run by the
`regex` module), written out again here so that the C++ tokenizer is checked against the
reference and not against itself. encoder.py does not treat <|endoftext|> specially; like
tiktoken with allowed_special="all", the text is split at it first and its id put in between.

usage: gpt2_reference.py DATA_DIR OUT_DIR
  DATA_DIR (the repository's configs/data) holds tinyshakespeare.txt and gpt2/{encoder.json,vocab.bpe}.
  Writes into OUT_DIR:
    cases.json              varied texts, their pre-tokenizer pieces and ids
    tinyshakespeare.ids     the ids of the whole of tinyshakespeare.txt (int32, little-endian)
    classes.bin             per code point 0..0x10FFFF, the regex's class: L, N, S(pace), O(ther),
                            or X (surrogates, and characters newer than this Python's Unicode data,
                            which a PCRE2 of the same Unicode version cannot know)
    tokenizer.json          the same vocabulary as a Hugging Face tokenizer.json (merges as pairs)
    small_tokenizer.json    a 2257-token vocabulary: the 256 bytes, the first 2000 merges (written
                            as "a b" strings) and <|endoftext|>
    small_cases.json        the texts of cases.json encoded with the small vocabulary
Exits 77 (ctest's "skipped") when the `regex` module is missing, 1 when a file of DATA_DIR is (they ship with
the repository).
"""
import json
import os
import random
import struct
import sys
import unicodedata

SKIP = 77

try:
    import regex as re
except ImportError:
    print("skipped: the Python `regex` module is missing (Debian: apt-get install python3-regex)")
    sys.exit(SKIP)

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
END_OF_TEXT = "<|endoftext|>"


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def get_pairs(word):
    pairs = set()
    prev_char = word[0]
    for char in word[1:]:
        pairs.add((prev_char, char))
        prev_char = char
    return pairs


class Encoder:
    def __init__(self, encoder, bpe_merges):
        self.encoder = encoder
        self.byte_encoder = bytes_to_unicode()
        self.bpe_ranks = dict(zip(bpe_merges, range(len(bpe_merges))))
        self.cache = {}
        self.pat = re.compile(PATTERN)

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        if not pairs:
            return token
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        word = " ".join(word)
        self.cache[token] = word
        return word

    def pieces(self, text):
        return re.findall(self.pat, text)

    def encode_ordinary(self, text):
        ids = []
        for token in self.pieces(text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return ids

    def encode(self, text):
        ids = []
        for k, part in enumerate(text.split(END_OF_TEXT)):
            if k:
                ids.append(self.encoder[END_OF_TEXT])
            ids.extend(self.encode_ordinary(part))
        return ids


# Texts chosen to exercise every alternative of the pattern and the byte-level mapping.
CASES = [
    ("ascii", "Hello, world! This is a test of GPT-2's byte-level BPE tokenizer."),
    ("contractions", "I'm sure they'll say it's fine; we've done what you'd do. DON'T 'S 's 't 're 've 'm 'll 'd 'x ''s"),
    ("numbers", "In 1984, 3.14159 and 1,000,000 and 0x1F and ٣٤٥ and ⅔ and x² and １２３ and Ⅻ."),
    ("punctuation", "!!! ??? ... --- ;;;:::(((]]] @#$%^&*~` \"quoted\" 'single' «guillemets» — – …"),
    ("accents", "Café naïve résumé coöperate Ångström façade Straße ÉCOLE ŒUVRE"),
    ("combining", "e\u0301 a\u0308bc Z\u0335a\u0336l\u0337g\u0338o"),
    ("cjk", "日本語のテキスト、中文文本，한국어 텍스트。漢字とカタカナ"),
    ("emoji", "Emoji: 😀😃🎉 👩\u200d💻 🇫🇷 ❤️ 🤖x"),
    ("scripts", "Привет, мир! مرحبا بالعالم שָׁלוֹם Γειά σου ἀρχή नमस्ते ไทย"),
    ("whitespace", "a  b   c\t\td\n\ne \n \n  \u00a0x\u3000y\u2028z\u0085w \u180e \u200b \ufeff   "),
    ("leading", "   leading spaces"),
    ("trailing", "trailing spaces   "),
    ("newlines", "\n\n\nline\n\n  \n\tindented\r\nwindows\r\n"),
    ("tabs", "\tx\t\ty \t z\t"),
    ("only spaces", "     "),
    ("one space", " "),
    ("empty", ""),
    ("code", "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n"),
    ("special", "Hello<|endoftext|> world<|endoftext|><|endoftext|>again <|endoftext"),
    ("long word", "supercalifragilisticexpialidocious " * 3 + "pneumonoultramicroscopicsilicovolcanoconiosis"),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaa " + "=" * 40 + " " + "ab" * 20 + " " + " " * 33 + "x"),
    ("url", "https://example.com/path?query=1&b=2#frag user@example.org C:\\Users\\me"),
    ("control", "bell\x07 esc\x1b nul\x00 del\x7f fs\x1c us\x1f"),
]


def fuzz_cases(count, seed):
    """Random strings over an alphabet where the pattern's alternatives meet and overlap."""
    alphabet = ["a", "b", "Z", "é", "ß", "ǅ", "日", "😀", "1", "٣", "²", "⅔", "'", "s", "t", "re", "ll", "ve", "d", "m",
                " ", " ", " ", "  ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u0085", "\u2028", "\u180e", "\u200b",
                "!", ".", "-", "_", "\u0301", "\u200d", "\x00", "<|endoftext|>", "<|"]
    rng = random.Random(seed)
    out = []
    for k in range(count):
        n = rng.randint(0, 24)
        out.append(("fuzz %d" % k, "".join(rng.choice(alphabet) for _ in range(n))))
    return out


def classes():
    """The pattern's character classes, per code point."""
    letter = re.compile(r"\p{L}")
    number = re.compile(r"\p{N}")
    space = re.compile(r"\s")
    unassigned = re.compile(r"\p{Cn}")
    out = bytearray(0x110000)
    newer = 0
    for cp in range(0x110000):
        c = chr(cp)
        if 0xD800 <= cp <= 0xDFFF:
            out[cp] = ord("X")
            continue
        if unicodedata.category(c) == "Cn" and not unassigned.match(c):
            out[cp] = ord("X")  # assigned after this Python's Unicode version
            newer += 1
            continue
        out[cp] = ord("L" if letter.match(c) else "N" if number.match(c) else "S" if space.match(c) else "O")
    return out, newer


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    data_dir, out_dir = sys.argv[1], sys.argv[2]
    encoder_path = os.path.join(data_dir, "gpt2", "encoder.json")
    vocab_path = os.path.join(data_dir, "gpt2", "vocab.bpe")
    shakespeare_path = os.path.join(data_dir, "tinyshakespeare.txt")
    for p in (encoder_path, vocab_path, shakespeare_path):
        if not os.path.exists(p):
            print("error: %s is missing (it ships with the repository, under configs/data)" % p)
            return 1
    os.makedirs(out_dir, exist_ok=True)

    with open(encoder_path, "r", encoding="utf-8") as f:
        encoder = json.load(f)
    with open(vocab_path, "r", encoding="utf-8") as f:
        bpe_data = f.read()
    merges = [tuple(line.split()) for line in bpe_data.split("\n")[1:-1]]
    gpt2 = Encoder(encoder, merges)

    cases = CASES + fuzz_cases(400, seed=5)
    records = []
    for name, text in cases:
        pieces = [p for part in text.split(END_OF_TEXT) for p in gpt2.pieces(part)]
        records.append({"name": name, "text": text, "pieces": pieces, "ids": gpt2.encode(text)})
    with open(os.path.join(out_dir, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(records, f, ensure_ascii=True)

    with open(shakespeare_path, "r", encoding="utf-8") as f:
        shakespeare = f.read()
    ids = gpt2.encode(shakespeare)
    with open(os.path.join(out_dir, "tinyshakespeare.ids"), "wb") as f:
        f.write(struct.pack("<%di" % len(ids), *ids))

    table, newer = classes()
    with open(os.path.join(out_dir, "classes.bin"), "wb") as f:
        f.write(table)

    added = [{"id": encoder[END_OF_TEXT], "content": END_OF_TEXT, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}]

    def tokenizer_json(vocab, merge_list, added_tokens):
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added_tokens,
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": merge_list},
        }

    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(encoder, [list(m) for m in merges], added), f, ensure_ascii=False)

    # A small vocabulary with its own ids: bytes first (id = byte value), then merge results.
    byte_encoder = bytes_to_unicode()
    small = {byte_encoder[b]: b for b in range(256)}
    small_merges = merges[:2000]
    for a, b in small_merges:
        small.setdefault(a + b, len(small))
    small[END_OF_TEXT] = len(small)
    small_added = [dict(added[0], id=small[END_OF_TEXT])]
    with open(os.path.join(out_dir, "small_tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(small, ["%s %s" % m for m in small_merges], small_added), f, ensure_ascii=True)
    small_encoder = Encoder(small, small_merges)
    with open(os.path.join(out_dir, "small_cases.json"), "w", encoding="utf-8") as f:
        json.dump([{"name": r["name"], "text": r["text"], "ids": small_encoder.encode(r["text"])} for r in records], f,
                  ensure_ascii=True)

    print("reference written to %s: %d cases, %d tinyshakespeare ids, small vocabulary of %d; %d code points newer "
          "than Unicode %s not compared" % (out_dir, len(records), len(ids), len(small), newer,
                                            unicodedata.unidata_version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
