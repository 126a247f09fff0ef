"""Hugging Face tokenizers' side of gpt2-bpe's tokenizer.json test (hf_bpe_test.cpp).

    hf_reference.py OUT_DIR [DATA_DIR]

DATA_DIR (the repository's configs/data) adds its tinyshakespeare.txt to the corpus and the cases.

Trains small byte-level BPE vocabularies with the `tokenizers` package (PyPI), each with the
pipeline of a model family as its tokenizer.json writes it, and records the ids `tokenizers`
gives for varied text:
  llama3   Llama 3's Split regex (\\p{N}{1,3}), ByteLevel without its regex, ignore_merges, special
           tokens <|begin_of_text|> <|end_of_text|> <|eot_id|> and a non-special added token;
  qwen2    Qwen 2's Split regex (\\p{N}), the NFC normalizer, <|endoftext|> <|im_start|> <|im_end|>
           and a non-special, normalized added token;
  splits   a Sequence of Splits with a String pattern, behavior Removed and invert, ending in
           GPT-2's ByteLevel with its regex.
For each NAME it writes NAME.tokenizer.json and NAME.expected.json, a list of {"name", "text",
"ids"} (tokenizer.encode(text, add_special_tokens=False): no template around the text).
Exits 77 when `tokenizers` cannot be imported.
"""

import json
import os
import random
import sys
import unicodedata

try:
    import tokenizers
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
except ImportError as e:  # the test skips, saying why
    print(f"tokenizers is not available: {e}", file=sys.stderr)
    sys.exit(77)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

# Characters of scripts assigned long before Unicode 14 (PCRE2 10.42's tables), so the letter and
# number classes agree with Oniguruma's.
POOLS = {
    "ascii": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "digits": "0123456789",
    "other_digits": "٠١٢٣٤٥٦٧٨٩०१२३४५६७८९½²³¼ⅣⅫ①",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~«»¿¡—–…·•€£¥§©®™°±×÷",
    "space": [" ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2028", "\u2003",
              "\u000b", "\u000c", "\u0085", "\u180e", "\u200b"],
    "latin": "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœŒÆÀÉÈÇÑÖÜĀāĒēŁłŚśŽžſK",
    "greek_cyrillic": "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΣΩабвгдеёжзийклмнопрстуфхцчшщъыьэюяЖЯ",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坐集编宝谈府拉黑且随格尽剑讲布杀微怕母调局根曾准团段终乐切级克精哪官示冷域",
    "kana_hangul": "あいうえおかきくけこさしすせそアイウエオカキクケコー한국어안녕하세요감사합니다",
    "other_scripts": "مرحبا بالعالم שלום नमस्ते दुनिया สวัสดี ქართული Հայերեն ગુજરાતી தமிழ்",
    "combining": "\u0300\u0301\u0302\u0303\u0308\u030a\u0327\u0323\u0331\u0342\u0345\u093c\u094d\u0e31",
    "emoji": ["😀", "😂", "🤖", "🚀", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "❤️", "🇫🇷", "🐍", "✨", "🎉", "🙏🏻", "🧑‍💻", "1️⃣"],
    "contractions": ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "’s", "'x"],
    "specials": ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>", "<|end_of_text|>",
                 "<|im_start", "café", "cafe\u0301", " <|eot_id|> ", "assistant"],
}


def random_text(rng, length):
    parts = []
    for _ in range(length):
        pool = rng.choice(list(POOLS))
        chars = POOLS[pool]
        if isinstance(chars, str):
            n = rng.randint(1, 6)
            parts.append("".join(rng.choice(chars) for _ in range(n)))
        else:
            parts.append(rng.choice(chars))
        if rng.random() < 0.4:
            parts.append(" ")
    return "".join(parts)


def corpus(data_dir):
    lines = []
    path = os.path.join(data_dir, "tinyshakespeare.txt") if data_dir else ""
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines += [text[i:i + 2000] for i in range(0, 200000, 2000)]
    rng = random.Random(1)
    words = ["the", "token", "model", "def", "return", "self", "loom", "über", "naïve", "東京", "北京", "中文", "日本語",
             "한국어", "😀", "🚀", "1234567", "3.14159", "don't", "I'll", "we've", "    ", "\n\n", "\t", "café",
             "cafe\u0301", "int main() {", "for (int i = 0; i < n; ++i)", "x += 1;", "    return x;", "}"]
    for _ in range(3000):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
    for _ in range(600):
        lines.append(random_text(rng, rng.randint(5, 30)))
    return lines


CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


int main(int argc, char** argv) {
\tstd::vector<int> v{1, 2, 3};\r\n\tfor (auto& x : v) x *= 2;  // double
\treturn v.size() > 2 ? 0 : 1;
}
'''

FIXED = [
    ("empty", ""),
    ("english", "Hello world! It's a test of the tokenizer, isn't it? We'll see: they've said I'm fine."),
    ("contractions_case", "IT'S WE'LL THEY'VE I'M YOU'D SHE'S DON'T It'S We'Ll they'RE"),
    ("code", CODE),
    ("digits", "1 12 123 1234 12345 123456 1234567 12345678901234567890 3.14159265358979 1,000,000 0x1F 2024-11-25"),
    ("other_digits", "٣٤٥ १२३४ ½ ² Ⅻ ①② 12½ x²"),
    ("whitespace", "a  b   c    d\t\te \n f\n\n\ng   \n  h\r\n\r\ni \u00a0j\u3000k\u2028l     "),
    ("trailing", "ends with spaces   "),
    ("leading", "   starts with spaces"),
    ("newlines_only", "\n\n\n"),
    ("cjk", "我们在北京学习中文。東京は日本の首都です。한국어를 공부합니다! 中文，标点：「引号」"),
    ("emoji", "I ❤️ 🤖s! 👍🏽👍🏽 👨‍👩‍👧 family 🏳️‍🌈 🇫🇷🇩🇪 1️⃣2️⃣ 🚀🚀🚀"),
    ("accents_nfc", unicodedata.normalize("NFC", "Café naïve résumé Ångström São Paulo Łódź Ærøskøbing")),
    ("accents_nfd", unicodedata.normalize("NFD", "Café naïve résumé Ångström São Paulo Łódź Ærøskøbing")),
    ("combining_stack", "e\u0301\u0302 a\u0308\u0304 q\u0323\u0307 \u0301alone x\u0345 ᾳ\u0342"),
    ("hangul_jamo", "\u1100\u1161\u11a8 \u1112\u1161\u11ab"),
    ("scripts", "مرحبا بالعالم! שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก Привет, мир! Γειά σου Κόσμε"),
    ("specials", "<|begin_of_text|>Hello<|eot_id|> <|eot_id|>\n<|im_start|>user\nHi<|im_end|>\n<|endoftext|>"
                 "<|im_start|<|end_of_text|><|endoftext"),
    ("added_normalized", "a café and a cafe\u0301, assistant assistants"),
    ("long_s_kelvin", "ſ ſtate 'ſ 'K K"),
    ("punctuation_runs", "!!! ??? ... --- *** ### \"quoted\" (parens) [brackets] {braces} <angles> a.b,c;d:e"),
    ("url_path", "https://example.com/a/b?c=1&d=2#frag /usr/lib/x86_64-linux-gnu/libfoo.so.1 C:\\Windows\\System32"),
    ("mixed", "The price is $1234.56 (≈ €1,100) — 50% off! 😀 我爱你 l'été"),
]


def cases(data_dir):
    out = list(FIXED)
    rng = random.Random(7)
    for i in range(300):
        out.append((f"random_{i}", random_text(rng, rng.randint(1, 40))))
    path = os.path.join(data_dir, "tinyshakespeare.txt") if data_dir else ""
    if path and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            out.append(("tinyshakespeare", f.read()))
    return out


def build(name, normalizer, pre_tokenizer, ignore_merges, specials, added, data_dir):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(data_dir), trainer)
    tok.add_tokens(added)
    return tok


def main():
    out_dir = sys.argv[1]
    data_dir = sys.argv[2] if len(sys.argv) > 2 else ""
    os.makedirs(out_dir, exist_ok=True)
    print(f"tokenizers {tokenizers.__version__}")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    configs = {
        "llama3": build("llama3", None,
                        pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated", invert=False),
                                                 byte_level]),
                        True, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
                        [AddedToken("assistant", special=False, normalized=False)], data_dir),
        "qwen2": build("qwen2", normalizers.NFC(),
                       pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated", invert=False),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                                         use_regex=False)]),
                       False, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                       [AddedToken("café", special=False, normalized=True)], data_dir),
        "splits": build("splits", None,
                        pre_tokenizers.Sequence([
                            pre_tokenizers.Split("--", "isolated"),
                            pre_tokenizers.Split(Regex(r"\s+"), "removed"),
                            pre_tokenizers.Split(Regex(r"[\p{L}\p{N}']+|-"), "removed", invert=True),
                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
                        False, ["<|endoftext|>"], [], data_dir),
    }
    texts = cases(data_dir)
    for name, tok in configs.items():
        tok.save(os.path.join(out_dir, name + ".tokenizer.json"))
        # Encode with the saved file, so what is checked is what loom reads.
        saved = Tokenizer.from_file(os.path.join(out_dir, name + ".tokenizer.json"))
        expected = [{"name": n, "text": t, "ids": saved.encode(t, add_special_tokens=False).ids} for n, t in texts]
        with open(os.path.join(out_dir, name + ".expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False)
        print(f"{name}: vocabulary {saved.get_vocab_size()}, {len(expected)} texts, "
              f"{sum(len(e['ids']) for e in expected)} tokens")


if __name__ == "__main__":
    main()
