#!/usr/bin/env python3
"""llama2c_encode.py: a faithful Python port of llama2.c's tokenizer `encode` (run.c), used to
make tests/data/tokenizer/tok512_reference.jsonl, the expected ids of the C tokenizer loading
models/stories260k-moe/tokenizer.json (made by tools/convert-tok512).

What run.c does, step by step (karpathy/llama2.c, run.c `encode`):
  1. optional BOS (1);
  2. if the text is not empty, the token of " " (the dummy prefix, add_dummy_prefix);
  3. each UTF-8 character (a lead byte plus at most 3 continuation bytes) is looked up;
     when absent each of its bytes becomes token byte + 3 (byte fallback);
  4. repeat: over every adjacent pair, look the concatenation of the two pieces up; take the
     pair with the highest score (strictly greater, so ties go to the first pair) and replace it
     by the merged token; stop when no pair concatenates to a piece;
  5. optional EOS (2).

Usage:
  llama2c_encode.py [--tok tok512.bin] SAMPLES.txt > reference.jsonl   (one text per line)
  llama2c_encode.py --check-merges TOKENIZER.json TEXT_FILE...  compares with rank-order BPE
"""
import argparse
import json
import struct
import sys

TOK512 = "/work/shared/data/models/stories260K/tok512.bin"


def load_vocab(path):
    with open(path, "rb") as f:
        data = f.read()
    off, vocab, scores = 4, [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        vocab.append(data[off:off + n])
        scores.append(score)
        off += n
    return vocab, scores


def encode(text, vocab, scores, bos, eos):
    """run.c encode() on the UTF-8 bytes of text."""
    lookup = {piece: i for i, piece in enumerate(vocab)}  # str_lookup (pieces are unique)
    raw = text.encode("utf-8")
    tokens = []
    if bos:
        tokens.append(1)
    if raw:
        tokens.append(lookup.get(b" ", -1))
    buf = b""
    for i, c in enumerate(raw):
        if c & 0xC0 != 0x80:
            buf = b""
        buf += bytes([c])
        nxt = raw[i + 1] if i + 1 < len(raw) else 0
        if (nxt & 0xC0) == 0x80 and len(buf) < 4:
            continue
        tid = lookup.get(buf, -1)
        if tid != -1:
            tokens.append(tid)
        else:
            tokens.extend(b + 3 for b in buf)
        buf = b""
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for i in range(len(tokens) - 1):
            tid = lookup.get(vocab[tokens[i]] + vocab[tokens[i + 1]], -1)
            if tid != -1 and scores[tid] > best_score:
                best_score, best_id, best_idx = scores[tid], tid, i
        if best_idx == -1:
            break
        tokens[best_idx:best_idx + 2] = [best_id]
    if eos:
        tokens.append(2)
    return tokens


def rank_bpe(text, tok):
    """Hugging Face BPE (lowest merge rank first, leftmost on ties) over tokenizer.json."""
    model = tok["model"]
    vocab = model["vocab"]
    ranks = {tuple(m): r for r, m in enumerate(model["merges"])}
    s = ("\u2581" + text).replace(" ", "\u2581") if text else ""
    syms = []
    for ch in s:
        if ch in vocab:
            syms.append(ch)
        else:
            syms.extend("<0x%02X>" % b for b in ch.encode("utf-8"))
    while True:
        best = None
        for i in range(len(syms) - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    return [vocab[x] for x in syms]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", default=TOK512)
    ap.add_argument("--check-merges", metavar="TOKENIZER_JSON")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    vocab, scores = load_vocab(a.tok)
    if a.check_merges:
        with open(a.check_merges, encoding="utf-8") as f:
            tok = json.load(f)
        n = bad = 0
        for path in a.files:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    text = line.rstrip("\n")
                    if path.endswith(".jsonl"):
                        text = json.loads(line).get("question", "")
                    n += 1
                    if encode(text, vocab, scores, False, False) != rank_bpe(text, tok):
                        bad += 1
                        if bad <= 5:
                            print("differs:", repr(text[:80]), file=sys.stderr)
        print(f"{n} texts, {bad} differ")
        return 1 if bad else 0
    for path in a.files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                text = line.rstrip("\n")
                rec = {"text": text,
                       "ids": encode(text, vocab, scores, False, False),
                       "ids_bos": encode(text, vocab, scores, True, False)}
                print(json.dumps(rec, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
