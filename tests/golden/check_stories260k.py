#!/usr/bin/env python3
"""Verify tools/convert-llama2c on stories260K and write tests/data/stories260k_dragon.json.

1. A numpy port of llama2.c run.c (forward, encode, decode, greedy generate with -t 0 -n 128)
   on the ORIGINAL stories260K.bin + tok512.bin must print exactly
   greedy_t0_n128_prompt_dragon.txt (recorded from the real run.c).
2. HF Qwen2MoeForCausalLM loaded from models/stories260k-moe (float32, eager) must greedy-decode
   the same ids.
Run: /root/venv/bin/python tests/golden/check_stories260k.py
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SRC = "/work/shared/data/models/stories260K"
PROMPT = "Once upon a time, there was a dragon"
STEPS = 128
BOS = 1


# ---------------------------------------------------------------- tokenizer (run.c semantics)
def load_tok(path, vocab_size=512):
    b = open(path, "rb").read()
    (max_len,) = struct.unpack("<i", b[:4])
    o, vocab, scores = 4, [], []
    for _ in range(vocab_size):
        s, n = struct.unpack("<fi", b[o:o + 8])
        o += 8
        vocab.append(b[o:o + n])
        scores.append(s)
        o += n
    assert o == len(b)
    lookup = {}
    for i, v in enumerate(vocab):
        assert v not in lookup, f"duplicate piece {v!r}: run.c bsearch would be ambiguous"
        lookup[v] = i
    return vocab, np.array(scores, np.float32), lookup


def encode(text, vocab, scores, lookup, bos=True):
    """run.c encode(): BOS, dummy prefix ' ', per-UTF-8-codepoint lookup with byte fallback (+3),
    then repeatedly merge the adjacent pair with the best score (first one wins ties)."""
    toks = [BOS] if bos else []
    data = text.encode("utf-8")
    if data:
        toks.append(lookup[b" "])
    i = 0
    while i < len(data):
        j = i + 1
        while j < len(data) and (data[j] & 0xC0) == 0x80 and j - i < 4:
            j += 1
        cp = data[i:j]
        if cp in lookup:
            toks.append(lookup[cp])
        else:
            toks.extend(c + 3 for c in cp)
        i = j
    while True:
        best, best_id, best_i = -1e10, -1, -1
        for k in range(len(toks) - 1):
            m = lookup.get(vocab[toks[k]] + vocab[toks[k + 1]])
            if m is not None and scores[m] > best:
                best, best_id, best_i = scores[m], m, k
        if best_i < 0:
            break
        toks[best_i:best_i + 2] = [best_id]
    return toks


def decode_piece(vocab, prev, tok):
    p = vocab[tok]
    if prev == BOS and p.startswith(b" "):
        p = p[1:]
    if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
        p = bytes([int(p[3:5], 16)])
    return p


def safe_bytes(p):
    """run.c safe_printf: skip single non-printable, non-whitespace bytes."""
    if len(p) == 1 and not (chr(p[0]).isprintable() or chr(p[0]).isspace()):
        return b""
    return p


# ---------------------------------------------------------------- run.c forward in numpy
def load_bin(path):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader("convert_llama2c", os.path.join(ROOT, "tools", "convert-llama2c"))
    spec = importlib.util.spec_from_loader("convert_llama2c", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod.read_llama2c(path)


def rmsnorm(x, w):
    ss = np.float32(np.dot(x, x) / x.size + np.float32(1e-5))
    return w * (np.float32(1.0) / np.sqrt(ss) * x)


class RunC:
    def __init__(self, hp, w):
        self.hp, self.w = hp, w
        L, S = hp["n_layers"], hp["seq_len"]
        self.hs = hp["dim"] // hp["n_heads"]
        kv_dim = hp["n_kv_heads"] * self.hs
        self.kc = np.zeros((L, S, kv_dim), np.float32)
        self.vc = np.zeros((L, S, kv_dim), np.float32)

    def rope(self, v, pos):
        hs = self.hs
        i = np.arange(0, v.size, 2)
        freq = (1.0 / np.power(np.float32(10000.0), (i % hs).astype(np.float32) / np.float32(hs))).astype(np.float32)
        val = np.float32(pos) * freq
        c, s = np.cos(val).astype(np.float32), np.sin(val).astype(np.float32)
        v0, v1 = v[0::2].copy(), v[1::2].copy()
        out = np.empty_like(v)
        out[0::2] = v0 * c - v1 * s
        out[1::2] = v0 * s + v1 * c
        return out

    def forward(self, token, pos):
        hp, w, hs = self.hp, self.w, self.hs
        nh, nkv = hp["n_heads"], hp["n_kv_heads"]
        x = w["tok_emb"][token].copy()
        for l in range(hp["n_layers"]):
            xb = rmsnorm(x, w["rms_att"][l])
            q = self.rope(w["wq"][l] @ xb, pos)
            self.kc[l, pos] = self.rope(w["wk"][l] @ xb, pos)
            self.vc[l, pos] = w["wv"][l] @ xb
            att_out = np.zeros(hp["dim"], np.float32)
            for h in range(nh):
                kvh = h // (nh // nkv)
                qh = q[h * hs:(h + 1) * hs]
                K = self.kc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                V = self.vc[l, :pos + 1, kvh * hs:(kvh + 1) * hs]
                sc = (K @ qh) / np.sqrt(np.float32(hs))
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                att_out[h * hs:(h + 1) * hs] = sc @ V
            x = x + w["wo"][l] @ att_out
            xb = rmsnorm(x, w["rms_ffn"][l])
            h1 = w["w1"][l] @ xb
            h3 = w["w3"][l] @ xb
            hb = h1 * (np.float32(1.0) / (np.float32(1.0) + np.exp(-h1))) * h3
            x = x + w["w2"][l] @ hb
        x = rmsnorm(x, w["rms_final"])
        return w["wcls"] @ x


def generate_runc(model, prompt_ids, steps):
    """run.c generate() with the argmax sampler; returns (generated ids, printed bytes, all logits)."""
    token, pos, gen, logits_all = prompt_ids[0], 0, [], []
    while pos < steps:
        logits = model.forward(token, pos)
        if pos < len(prompt_ids) - 1:
            nxt = prompt_ids[pos + 1]
        else:
            nxt = int(np.argmax(logits))
            logits_all.append(logits)
            gen.append(nxt)
        pos += 1
        if nxt == BOS:
            break
        token = nxt
    return gen, logits_all


def main():
    vocab, scores, lookup = load_tok(os.path.join(SRC, "tok512.bin"))
    prompt_ids = encode(PROMPT, vocab, scores, lookup)
    print("prompt ids:", prompt_ids)
    hp, w = load_bin(os.path.join(SRC, "stories260K.bin"))
    ref = RunC(hp, w)
    gen, ref_logits = generate_runc(ref, prompt_ids, min(STEPS, hp["seq_len"]))
    stop_on_bos = bool(gen) and gen[-1] == BOS
    printed_ids = prompt_ids + [g for g in gen if g != BOS]
    out = b"".join(safe_bytes(decode_piece(vocab, printed_ids[i - 1], printed_ids[i]))
                   for i in range(1, len(printed_ids))) + b"\n"
    expected = open(os.path.join(SRC, "greedy_t0_n128_prompt_dragon.txt"), "rb").read()
    if out != expected:
        print("run.c port output:\n" + out.decode(errors="replace"))
        raise SystemExit("FAIL (1): numpy run.c port does not reproduce greedy_t0_n128_prompt_dragon.txt")
    print(f"(1) numpy run.c port reproduces the reference text: {len(gen)} generated ids"
          f"{' (stopped on BOS)' if stop_on_bos else ''}")

    import torch
    import transformers as T
    mdir = os.path.join(ROOT, "models", "stories260k-moe")
    model = T.Qwen2MoeForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="eager",
                                                  experts_implementation="eager").eval()
    ids = list(prompt_ids)
    hf_gen = []
    with torch.no_grad():
        while len(ids) < STEPS + 1 and len(hf_gen) < len(gen) + 1:
            lg = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            nxt = int(lg.argmax())
            hf_gen.append(nxt)
            if nxt == BOS:
                break
            ids.append(nxt)
        full = model(input_ids=torch.tensor([prompt_ids + gen[:-1]]), use_cache=False).logits[0]
    hf_gen = hf_gen[:len(gen)]
    if hf_gen != gen:
        k = next(i for i, (a, b) in enumerate(zip(hf_gen, gen)) if a != b)
        raise SystemExit(f"FAIL (2): HF converted model diverges at generated token {k}: {hf_gen[k]} vs {gen[k]}")
    d = np.abs(full[len(prompt_ids) - 1:].numpy() - np.stack(ref_logits)).max()
    print(f"(2) HF Qwen2MoeForCausalLM on models/stories260k-moe greedy-decodes the same {len(gen)} ids; "
          f"max |logit diff| vs run.c port = {d:.2e}")

    text = out.decode("utf-8")
    j = {"prompt_ids": prompt_ids, "expected_ids": gen, "text": text, "prompt": PROMPT,
         "steps": STEPS, "stops_on_bos": stop_on_bos,
         "note": "run.c -t 0 -n 128 -i PROMPT: steps count prompt positions; expected_ids are the generated "
                 "ids only (a final 1 = BOS ends generation and is not printed); text is run.c's stdout"}
    p = os.path.join(ROOT, "tests", "data", "stories260k_dragon.json")
    with open(p, "w") as f:
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in j.items()) + "\n}\n")
    print("wrote", p)


if __name__ == "__main__":
    main()
