#!/usr/bin/env python3
"""Build a Qwen2-style tokenizer.json from the committed GPT-2 one, and record Hugging Face's
encodings of it for msmoed's tokenizer tests.

Qwen2/2.5/3 tokenizers are byte-level BPE with an NFC normalizer and a Split(regex) + ByteLevel
pre-tokenizer. Their real vocabulary is not in the tree, so this script takes GPT-2's vocabulary
and merges (tests/data/tokenizer/gpt2/tokenizer.json) and puts Qwen2's normalizer, pre_tokenizer,
decoder and model flags around them, with Qwen's chat special tokens added after GPT-2's ids.
Nothing is downloaded.

Outputs (both committed; CI never runs this script):
  tests/data/tokenizer/qwen-style/tokenizer.json   written with the standard library only
  tests/data/tokenizer/qwen_style_reference.jsonl  one record per (normalizer, text):
      {"normalizer": <the tokenizer.json "normalizer" object>, "text": str, "ids": [int],
       "decoded": str}
    made by the PyPI `tokenizers` package (Hugging Face's Rust tokenizers) on the tokenizer.json
    above with its "normalizer" replaced by the record's: encode(text, add_special_tokens=False)
    and decode(ids, skip_special_tokens=False). The first group is the file's own NFC.

Run:  /root/venv/bin/python tests/golden/make_qwen_style_tokenizer.py
      (--no-reference writes only tokenizer.json and needs no third-party package)
"""
import argparse
import json
import os
import sys

# Qwen2's pre-tokenizer regex, exactly as in its tokenizer.json: contractions in any case, a
# letter run with at most one leading non-letter, ONE digit per piece, punctuation with trailing
# newlines, newline runs, then whitespace.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

BYTELEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}

# Normalizers the reference covers; the first is the one written into tokenizer.json.
NORMALIZERS = [
    {"type": "NFC"},
    {"type": "NFD"},
    {"type": "NFKC"},
    {"type": "NFKD"},
    {"type": "Lowercase"},
    {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]},
    # Accent stripping as BERT-like tokenizers spell it with Replace: NFD, then drop marks.
    {"type": "Sequence", "normalizers": [
        {"type": "NFD"},
        {"type": "Replace", "pattern": {"Regex": r"\p{Mn}"}, "content": ""},
        {"type": "NFC"}]},
    # SentencePiece-style steps after a Unicode one.
    {"type": "Sequence", "normalizers": [
        {"type": "NFKC"},
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
]

TEXTS = [
    "",
    "Hello world",
    # NFC: decomposed e + COMBINING ACUTE composes to U+00E9; precomposed stays.
    "cafe\u0301",
    "caf\u00e9 and cafe\u0301 are the same word",
    "Cafe\u0301 au lait, cre\u0300me bru\u0302le\u0301e",
    "A\u030a and \u212b (angstrom sign) and \u00c5",
    "\u2126hm (ohm sign) vs \u03a9",
    # Canonical ordering of combining marks (dot below before circumflex).
    "a\u0302\u0323 vs a\u0323\u0302 vs \u1ead",
    "Tie\u0302\u0301ng Vie\u0323\u0302t co\u0301 da\u0302\u0301u",
    # Hangul: conjoining jamo compose into syllables; precomposed syllables decompose under NFD.
    "\u1100\u1161\u11a8",
    "\u1112\u1161\u11ab\u1100\u1173\u11af \ud55c\uad6d\uc5b4",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.",
    "\u1100\u1161 \u1102\u1161\u11ab",
    # Ligatures and compatibility characters: kept by NFC/NFD, replaced by NFKC/NFKD.
    "\ufb01nance and \ufb02ow, e\ufb03cient",
    "x\u00b2 + y\u00b3 = z\u00b2, \u2460\u2461\u2462, 10\u338f",
    "\u2026 wait\u2026",
    "\uff76\uff9e\uff77\uff9e (half-width kana) \uff21\uff22\uff23 \uff11\uff12\uff13",
    "non\u00a0breaking\u2003em\u2009thin",
    # Digits: the Qwen regex makes one piece per digit, any script.
    "12345",
    "year 2024: 3.14159, 1,000,000 and 0x1F",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff14\uff15",
    # CRLF and newline runs: [\r\n]* after punctuation, \s*[\r\n]+.
    "line1\r\nline2\r\n\r\n  \r\nend",
    "a\r\r\n\n b\r\n",
    "Dear team,\r\n\r\nThanks!\r\n\r\n\r\n-- \r\nBob",
    "  \n\n\t\n   x",
    # Contractions in upper and mixed case: (?i:...) matches them.
    "I'M SURE HE'LL SAY WE'VE DONE IT, DON'T YOU THINK? IT'S",
    "She'S, they'Re, you'VE, I'd, I'D, we'Ll",
    # Lowercase: Greek final sigma, dotted capital I, sharp s.
    "\u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 \u03a3\u0391\u03a3",
    "\u0130stanbul and \u1e9e and STRASSE",
    # Mixed scripts, emoji and Qwen chat special tokens (matched on the raw text).
    "<|im_start|>user\nQu'est-ce que la cre\u0300me bru\u0302le\u0301e?<|im_end|>\n<|im_start|>assistant\n",
    "e<|im_end|>\u0301 (a mark right after a special token)",
    "\u0301 starts with a combining mark",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u30ac \u30ab\u3099 \U0001f409\U0001f917 \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "def f(x):\r\n    return x**2  # squares\r\n",
    "na\u00efve na\u0131\u0308ve \u0131\u0307",
]

SPECIALS = ["<|im_start|>", "<|im_end|>"]


def build(gpt2):
    """The Qwen2-style tokenizer.json object from GPT-2's."""
    model = gpt2["model"]
    next_id = max(max(model["vocab"].values()), max(a["id"] for a in gpt2["added_tokens"])) + 1
    added = []
    for a in gpt2["added_tokens"] + [{"id": next_id + i, "content": c} for i, c in enumerate(SPECIALS)]:
        # As in Qwen's files: special, and matched on the raw (not normalised) text.
        added.append({"id": a["id"], "content": a["content"], "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": NORMALIZERS[0],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
            BYTELEVEL]},
        "post_processor": BYTELEVEL,
        "decoder": BYTELEVEL,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": model["vocab"], "merges": model["merges"]},
    }


def dumps(obj):
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def reference(tok_json, out_path):
    from tokenizers import Tokenizer  # only here: the rest of the script is standard library

    n = 0
    with open(out_path, "w", encoding="utf-8", newline="\n") as f:
        for norm in NORMALIZERS:
            variant = dict(tok_json, normalizer=norm)
            tok = Tokenizer.from_str(dumps(variant))
            for text in TEXTS:
                ids = tok.encode(text, add_special_tokens=False).ids
                rec = {"normalizer": norm, "text": text, "ids": ids,
                       "decoded": tok.decode(ids, skip_special_tokens=False)}
                f.write(dumps(rec) + "\n")
                n += 1
    return n


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_dir = os.path.normpath(os.path.join(here, "..", "data", "tokenizer"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=default_dir)
    ap.add_argument("--no-reference", action="store_true", help="write tokenizer.json only")
    args = ap.parse_args()

    with open(os.path.join(args.data_dir, "gpt2", "tokenizer.json"), encoding="utf-8") as f:
        tok = build(json.load(f))
    os.makedirs(os.path.join(args.data_dir, "qwen-style"), exist_ok=True)
    tok_path = os.path.join(args.data_dir, "qwen-style", "tokenizer.json")
    with open(tok_path, "w", encoding="utf-8", newline="\n") as f:
        f.write(dumps(tok))
    print(f"{tok_path}: {os.path.getsize(tok_path)} bytes", file=sys.stderr)
    if not args.no_reference:
        ref_path = os.path.join(args.data_dir, "qwen_style_reference.jsonl")
        n = reference(tok, ref_path)
        print(f"{ref_path}: {n} records", file=sys.stderr)


if __name__ == "__main__":
    main()
