#!/usr/bin/env python3
"""Fixtures for the C++ tokenizer (libcaf_serving/text, issue 34).

Builds a deterministic corpus of a little over 1 MB that mixes scripts, emoji
(ZWJ sequences, skin tones, flags), whitespace runs, CRLF, digits, code,
contractions and special tokens inside the text; trains three small BPE
tokenizers on it with Hugging Face `tokenizers` (no download: nothing can be
fetched) and writes, for each, its tokenizer.json and what HF makes of every
corpus record:

  gpt2    byte-level BPE, ByteLevel pre-tokenizer (GPT-2's regex), merges as
          "a b" strings, ByteLevel decoder and post-processor
  llama3  byte-level BPE, Split(Llama-3's regex) + ByteLevel(use_regex=false),
          ignore_merges, merges as ["a", "b"] pairs, a TemplateProcessing bos
  llama2  byte-fallback BPE (<0xXX> tokens), normalizer
          Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer, decoder
          Sequence[Replace, ByteFallback, Fuse, Strip], TemplateProcessing "<s> $A"
  llama2_metaspace  the same model with a Metaspace pre-tokenizer (prepend_scheme
          "first", split) and a Metaspace decoder
  qwen2   the llama3 model with Qwen2's pipeline: NFC normalizer, Qwen2's regex
          (one digit at a time), ByteLevel post-processor

Outputs in libcaf_serving/text/testdata/:
  corpus.txt.gz                records, UTF-8, separated by NUL bytes
  <name>.tokenizer.json.gz     the tokenizer HF loads
  edge_cases.json              short texts (added-token edges) with HF's ids and decodes,
                               also for variants the test makes by one string replace
  <name>.expected.gz           one line per record:
        "<count> <ids hash> <decode hash>"  and, for every 64th record, the
        ids themselves after a "|" so that a mismatch prints a diff.
The hashes are FNV-1a 64 over the ids as little-endian int32 and over the
UTF-8 bytes of HF's decode(ids, skip_special_tokens=False).

Characters are those assigned in Unicode 14.0 (Python's unicodedata here; the
C++ tables come from tools/unicode_tables.py with the same version).

Usage: /work/venv/bin/python tools/tokenizer_fixtures.py
       /work/venv/bin/python tools/tokenizer_fixtures.py --bench
         HF's encode throughput on the committed corpus and tokenizers (encode_batch
         of all records, best of 5), to set beside text-tokenizer-bench; set
         RAYON_NUM_THREADS=1 for one thread, as the C++ benchmark uses.
"""

import gzip
import json
import os
import random
import struct
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "libcaf_serving", "text",
                   "testdata")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

ENGLISH = ("the of and to in is was that for it with as his on be at by this had not are but "
           "from or have an they which one you were her all she there would their we him been "
           "has when who will more no if out so said what up its about into than them can only "
           "other new some could time these two may then do first any my now such like our over "
           "man me even most made after also did many before must through back years where much "
           "your way well down should because each just those people how too little state good "
           "very make world still own see men work long get here between both life being under "
           "never day same another know while last might us great old year off come since "
           "against go came right used take three tokenizer model server engine batch request "
           "latency throughput gpu gpus GPU xgpu kernel cache stream Hello hello HELLO World "
           "OpenAI Llama Qwen transformer attention").split()
CONTRACTIONS = ("don't it's they're we've I'm you'll he'd IT'S DON'T We'RE can't won't "
                "she's y'all o'clock rock'n'roll it'ſ 'tis").split()
ACCENTED = ("café naïve résumé über Straße Müller façade déjà-vu coöperate jalapeño "
            "Zürich Łódź żółć Ångström smörgåsbord Việt Nam tiếng Việt phở Đà Nẵng "
            "São Paulo ação coração İstanbul ığdır şeker").split()
# For NFC: decomposed letters, marks out of canonical order, singletons (Ångström
# sign, Ohm sign), conjoining Hangul jamo, a composition exclusion (U+0958).
DECOMPOSED = ["cafe\u0301", "nai\u0308ve", "e\u0301te\u0301", "A\u030a", "n\u0303",
              "a\u0301\u0323", "Vie\u0323\u0302t", "\u212b", "\u2126", "\u1100\u1161\u11a8",
              "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u0915\u093c", "\u0958",
              "\u1e9b\u0323", "o\u0308\u0304", "\u0301a", "x\u0345\u0301"]
CYRILLIC = ("Привет мир как дела это проверка токенизатора Москва Санкт-Петербург "
            "съешь же ещё этих мягких французских булок да выпей чаю ЁЛКА ёжик").split()
GREEK = ("Καλημέρα κόσμε αυτό είναι ένα τεστ Αθήνα φιλοσοφία ΑΛΦΑ ωμέγα ψυχή "
         "ξεσκεπάζω τὴν ψυχοφθόρα βδελυγμία").split()
CHINESE = list("我们的模型服务器在处理请求时使用连续批处理这是一个测试中文分词器的句子")
JAPANESE = ["こんにちは", "世界", "トークナイザー", "です", "カタカナ", "ひらがな", "東京", "日本語"]
KOREAN = ["안녕하세요", "세계", "토크나이저", "테스트", "한국어", "서울"]
ARABIC = "مرحبا بالعالم هذا اختبار للمحلل اللغوي العربية القاهرة ٢٠٢٤ ١٢٣".split()
HEBREW = "שלום עולם זהו מבחן של המפצל ירושלים עברית".split()
DEVANAGARI = "नमस्ते दुनिया यह एक परीक्षण है हिन्दी भाषा दिल्ली १२३४".split()
THAI = ["สวัสดีชาวโลก", "นี่คือการทดสอบ", "ภาษาไทย", "กรุงเทพมหานคร"]
EMOJI = ["😀", "🎉", "👍", "👍🏽", "👋🏿", "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "🇫🇷", "🇯🇵", "1️⃣",
         "❤️", "🔥", "🤖", "🧑🏻‍🚀", "✨", "🙏🏼", "💯", "🚀", "👁️‍🗨️"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<mask>",
            "[INST]", "<|im_", "</s", "<<s>>", "< s>"]
CODE = [
    "def foo(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "if (a != b && c >= d) { std::cout << \"ok\\n\"; }",
    "{\"id\": 42, \"name\": \"widget\", \"tags\": [\"a\", \"b\"], \"price\": 3.14}",
    "SELECT name, COUNT(*) FROM users WHERE age > 21 GROUP BY name;",
    "#include <vector>\r\nint main() { return 0; }\r\n",
    "x = [i*i for i in range(10) if i % 2 == 0]",
    "$ ls -la /usr/local/bin | grep -v '^d' > out.txt 2>&1",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "<div class=\"row\"><span>&nbsp;text&amp;more</span></div>",
]
WHITESPACE = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\r\n",
              "\r\n\r\n", " \n", "\n ", " \t \n  ", "\u00a0", "\u3000", "\u2028", "\u2003",
              "\n\n\n", "  \r\n  "]


def number(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randrange(10))
    if kind == 1:
        return str(rng.randrange(10 ** rng.randrange(2, 13)))
    if kind == 2:
        return f"{rng.random() * 1000:.{rng.randrange(1, 6)}f}"
    if kind == 3:
        return f"{rng.randrange(10 ** 7):,}"
    if kind == 4:
        return "".join(chr(0x660 + rng.randrange(10)) for _ in range(rng.randrange(1, 6)))
    return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"


def word(rng):
    pools = [(ENGLISH, 30), (CONTRACTIONS, 4), (ACCENTED, 5), (DECOMPOSED, 3), (CYRILLIC, 5),
             (GREEK, 4), (CHINESE, 6), (JAPANESE, 3), (KOREAN, 3), (ARABIC, 3), (HEBREW, 2),
             (DEVANAGARI, 3), (THAI, 2), (EMOJI, 4), (SPECIALS, 3)]
    total = sum(w for _, w in pools)
    r = rng.randrange(total + 6)
    if r >= total:
        return number(rng) if r < total + 4 else rng.choice(CODE)
    for pool, w in pools:
        if r < w:
            return rng.choice(pool)
        r -= w
    raise AssertionError


def separator(rng):
    r = rng.random()
    if r < 0.72:
        return " "
    if r < 0.80:
        return rng.choice([", ", ". ", "! ", "? ", ": ", "; ", " - ", "...", "'", "\"", "(", ")"])
    if r < 0.83:
        return ""
    return rng.choice(WHITESPACE)


def record(rng):
    n = rng.randrange(1, 80)
    parts = []
    if rng.random() < 0.1:
        parts.append(rng.choice(WHITESPACE))
    for i in range(n):
        parts.append(word(rng))
        if i + 1 < n:
            parts.append(separator(rng))
    if rng.random() < 0.15:
        parts.append(rng.choice(WHITESPACE))
    return "".join(parts)


def corpus():
    rng = random.Random(34)
    # A few hand-made edge cases first, then generated records up to > 1 MB.
    records = ["", " ", "  ", "\n", "a", "Hello", " Hello", "Hello world", "<|endoftext|>",
               "<s>", "<s>Hello</s>", "a<|im_start|>b<|im_end|>c", "  <mask>  x", "x <mask>",
               "gpu gpus xgpu gpu.", "hello world", "I said hello world!", "it's IT'S it'ſ",
               "中文", "👨‍👩‍👧‍👦👍🏽", "\r\n\r\n", "   \n\n   x", "١٢٣٤٥ 12345 123456789",
               "\t\tdef f():\n\t\t\treturn 1", "[INST] hi [/INST]", "ſ", "\u00a0\u00a0x"]
    size = sum(len(r.encode()) for r in records)
    while size < 1_100_000:
        r = record(rng)
        records.append(r)
        size += len(r.encode())
    for r in records:
        assert "\0" not in r
    return records


def fnv1a(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def train_byte_level(records, pre_tokenizer, specials, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(records, trainer)
    return tok


def make_gpt2(records):
    tok = train_byte_level(records, pre_tokenizers.ByteLevel(add_prefix_space=False),
                           ["<|endoftext|>"], 3000)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([AddedToken("<mask>", lstrip=True, special=False)])
    j = json.loads(tok.to_str())
    # GPT-2's own file lists merges as "a b" strings: exercise that format here.
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                            for m in j["model"]["merges"]]
    return j


def make_llama3(records):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = train_byte_level(records, pre, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 3500)
    # "gpu" is in the vocabulary already (the same id either way); "qzxj" is new;
    # "xjvv" overlaps it (a rejected "qzxj" still hides it from the search).
    tok.add_tokens([AddedToken("gpu", single_word=True, special=False),
                    AddedToken("qzxj", single_word=True, special=False),
                    AddedToken("xjvv", special=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", pair="<|endoftext|> $A <|endoftext|> $B:1",
        special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = True
    return j


def alphabet_limit(records, near=150):
    """A limit_alphabet close to `near` that falls between two clearly different
    character counts: HF keeps the most frequent characters, and among equal
    counts its choice follows a hash map's order, which changes from run to
    run. The counts here are those of the normalized text, near enough to HF's
    (which leaves out the special tokens) for a wide gap."""
    from collections import Counter
    counts = Counter()
    for r in records:
        if r:
            counts.update("▁" + r.replace(" ", "▁"))
    ordered = sorted(counts.values(), reverse=True)
    gaps = [(ordered[k - 1] - ordered[k], k) for k in range(near - 30, near + 30)]
    gap, k = max(gaps)
    assert gap >= 10, gaps
    return k


def make_llama2(records):
    # Train with words split at "▁" (the trainer needs words), then write the file the
    # way Llama-2's conversion does: no pre-tokenizer, the whole piece is one word.
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials,
                                  limit_alphabet=alphabet_limit(records),
                                  show_progress=False)
    tok.train_from_iterator(records, trainer)
    j = json.loads(tok.to_str())
    trained = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {}
    for s in specials:
        vocab[s] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in trained:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    j["model"]["vocab"] = vocab
    j["added_tokens"] = [dict(t, id=vocab[t["content"]]) for t in j["added_tokens"]]
    j["pre_tokenizer"] = None
    j["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(content=" ", left=1, right=0)]).__getstate__())
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_tokens([AddedToken("[INST]", rstrip=True, normalized=False, special=False),
                    AddedToken("hello world", normalized=True, special=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return json.loads(tok.to_str())


def make_llama2_metaspace(llama2):
    # The same model behind a Metaspace pre-tokenizer (prepend_scheme "first", split at
    # every "▁") and a Metaspace decoder, as newer Llama / Mistral conversions have it.
    j = json.loads(json.dumps(llama2))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": True}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    for t in j["added_tokens"]:
        if t["content"] == "hello world":
            t["content"] = "▁hello▁world"  # what the normalized form was; matched raw now
            t["normalized"] = False
    return j


def make_qwen2(llama3):
    # The Llama-3 model behind Qwen2's pipeline: an NFC normalizer, Qwen2's regex
    # (digits one at a time), merges applied always, no bos.
    j = json.loads(json.dumps(llama3))
    j["normalizer"] = {"type": "NFC"}
    split = j["pre_tokenizer"]["pretokenizers"][0]
    split["pattern"]["Regex"] = split["pattern"]["Regex"].replace(r"\p{N}{1,3}", r"\p{N}")
    j["model"]["ignore_merges"] = False
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False}
    return j


# Variants the C++ test derives from a fixture by replacing one exact string of its JSON.
VARIANTS = {
    "gpt2_prefix": ("gpt2", '"add_prefix_space": false', '"add_prefix_space": true'),
    # Metaspace without split (Mistral's newer files): the whole piece is one word.
    "llama2_nosplit": ("llama2_metaspace", '"split": true', '"split": false'),
}

EDGE_TEXTS = ["", " ", "a", " a", "  a", "\tq", "<|endoftext|>", "x<|endoftext|>y",
              "x <|endoftext|> y", "<|endoftext|><|endoftext|>", "<|im_start|>user\nhi<|im_end|>\n",
              "<|im_", "a <mask>b", "a  <mask>", "<mask>", "  <mask>", "gpu", "gpus gpu", "xgpu gpu_",
              "(gpu)", "ÄGPU gpu9 gpu", "<s>", "x<s>y z", "<s>y", "</s></s>", "[INST]  x", "[INST]",
              "hello world", "say hello world", "hello worlds", "1234567", "١٢٣٤٥",
              "it'S IT'LL 'RE x'ſ", "\r\n\r\n x", "  \n\n  y", "\u3000a", "👨‍👩‍👧‍👦", "中文字",
              "e\u0301", "\u00a0\u00a0x", "\u212b\u2126 a\u0301\u0323 \u1100\u1161\u11a8",
              "\u0958 \u1e9b\u0323 q\u0307\u0323",
              # single_word's word characters are Rust regex's \w: marks and ‿ are,
              # ² and ½ are not; so are ZWJ and the circled letters
              "qzxj\u0301 qzxj", "qzxj\u00b2", "\u00bdqzxj", "qzxj\u203f", "\u200dqzxj",
              "\u24b6qzxj", "qzxj qzxjqzxj _qzxj", "aqzxjvv", " qzxjvv xjvv"]


def edge_cases(tokenizers):
    cases = []
    for name, j in tokenizers.items():
        tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
        for text in EDGE_TEXTS:
            for special in (True, False):
                ids = tok.encode(text, add_special_tokens=special).ids
                cases.append({"tokenizer": name, "text": text, "add_special_tokens": special,
                              "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                              "decoded_skip": tok.decode(ids, skip_special_tokens=True)})
    with open(os.path.join(OUT, "edge_cases.json"), "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")


def write_expected(name, j, records):
    tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    encodings = tok.encode_batch(records, add_special_tokens=True)
    lines = []
    for i, (text, enc) in enumerate(zip(records, encodings)):
        ids = enc.ids
        decoded = tok.decode(ids, skip_special_tokens=False)
        line = (f"{len(ids)} {fnv1a(struct.pack(f'<{len(ids)}i', *ids)):016x} "
                f"{fnv1a(decoded.encode()):016x}")
        if i % 64 == 0:
            line += "|" + " ".join(map(str, ids))
        lines.append(line)
    with gzip.GzipFile(os.path.join(OUT, f"{name}.expected.gz"), "wb", mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())
    with gzip.GzipFile(os.path.join(OUT, f"{name}.tokenizer.json.gz"), "wb", mtime=0) as f:
        f.write(json.dumps(j, ensure_ascii=False, indent=1).encode())
    print(f"{name}: vocab {tok.get_vocab_size()}, {sum(len(e.ids) for e in encodings)} ids")


def bench():
    import time
    with gzip.open(os.path.join(OUT, "corpus.txt.gz")) as f:
        records = f.read().decode().split("\0")
    size = sum(len(r.encode()) for r in records)
    threads = os.environ.get("RAYON_NUM_THREADS", "all cores")
    for name in ("gpt2", "llama3", "qwen2", "llama2", "llama2_metaspace"):
        with gzip.open(os.path.join(OUT, f"{name}.tokenizer.json.gz")) as f:
            tok = Tokenizer.from_str(f.read().decode())
        tok.encode_batch(records)  # warm the word cache, as the C++ benchmark's first pass does
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            tok.encode_batch(records, add_special_tokens=True)
            best = min(best, time.perf_counter() - start)
        print(f"HF encode_batch {name}: {size / best / 2**20:.1f} MiB/s "
              f"({size} bytes in {best * 1000:.1f} ms, threads: {threads})")


def main():
    if "--bench" in sys.argv:
        return bench()
    os.makedirs(OUT, exist_ok=True)
    records = corpus()
    with gzip.GzipFile(os.path.join(OUT, "corpus.txt.gz"), "wb", mtime=0) as f:
        f.write("\0".join(records).encode())
    print(f"corpus: {len(records)} records, {sum(len(r.encode()) for r in records)} bytes")
    made = {"gpt2": make_gpt2(records), "llama3": make_llama3(records),
            "llama2": make_llama2(records)}
    made["llama2_metaspace"] = make_llama2_metaspace(made["llama2"])
    made["qwen2"] = make_qwen2(made["llama3"])
    for name, j in made.items():
        write_expected(name, j, records)
    for name, (base, old, new) in VARIANTS.items():
        text = json.dumps(made[base], ensure_ascii=False, indent=1)
        assert text.count(old) == 1, (name, old)
        made[name] = json.loads(text.replace(old, new))
    edge_cases(made)


if __name__ == "__main__":
    sys.exit(main())
