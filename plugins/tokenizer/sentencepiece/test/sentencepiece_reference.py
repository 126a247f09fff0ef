"""The `sentencepiece` Python package's side of the sentencepiece tokenizer test.

    sentencepiece_reference.py TINYSHAKESPEARE_TXT OUT_DIR

Trains a unigram model (Llama 2 / Gemma style: byte fallback, digits split, whitespace kept) and
a BPE model on tinyshakespeare (configs/data/tinyshakespeare.txt) and generated text, both written to
OUT_DIR/<kind>.model, then encodes varied texts with each and writes OUT_DIR/expected.json:
{"texts": [...], "<kind>": [[ids of text 0], ...]}. Exits 77 when sentencepiece cannot be
imported.
"""

import json
import os
import random
import sys

try:
    import sentencepiece as spm
except ImportError as e:  # the test skips, saying why
    print(f"sentencepiece is not available: {e}", file=sys.stderr)
    sys.exit(77)


def generated_text(seed, n):
    """Emoji, CJK, combining marks, whitespace runs, digits, mixed with ASCII words."""
    rng = random.Random(seed)
    pieces = ["hello", "world", "The", "loom", "weaves", " ", "  ", "\t", "\n", "\n\n", "   \t ", "0", "42",
              "3.14159", "2024-11-24", "1234567890", "😀", "🧵🪡", "👩‍💻", "漢字", "日本語のテキスト", "中文",
              "한국어", "e\u0301", "n\u0303o", "a\u0308\u0304", "Ελληνικά", "русский", "!", "?", "...", "'s",
              "«»", "—", "ﬁ", "Ⅻ", "①"]
    return "".join(rng.choice(pieces) + (" " if rng.random() < 0.5 else "") for _ in range(n))


def main():
    path, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    corpus = open(path, encoding="utf-8").read()[:300000]
    corpus += "\n" + "\n".join(generated_text(s, 40) for s in range(200))
    train = os.path.join(out, "train.txt")
    with open(train, "w", encoding="utf-8") as f:
        f.write(corpus)
    common = dict(input=train, vocab_size=800, character_coverage=0.9995, byte_fallback=True, split_digits=True,
                  allow_whitespace_only_pieces=True, num_threads=1, minloglevel=2)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(out, "unigram"), model_type="unigram", **common)
    spm.SentencePieceTrainer.train(model_prefix=os.path.join(out, "bpe"), model_type="bpe", **common)

    texts = [corpus[i:i + 400] for i in range(0, min(len(corpus), 200000), 20000)]
    texts += [generated_text(1000 + s, 60) for s in range(20)]
    texts += ["", " ", "   leading and trailing   ", "\u00a0non-breaking\u3000ideographic space",
              "tabs\t\tand\nnewlines\r\n", "unseen: ☃ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ǅ ﷽"]
    expected = {"texts": texts}
    for kind in ("unigram", "bpe"):
        sp = spm.SentencePieceProcessor(model_file=os.path.join(out, kind + ".model"))
        expected[kind] = [sp.encode(t) for t in texts]
        expected[kind + "_decoded"] = [sp.decode(ids) for ids in expected[kind]]
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False)
    print(f"sentencepiece {spm.__version__}: {len(texts)} texts")


if __name__ == "__main__":
    main()
