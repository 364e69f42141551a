#!/usr/bin/env python3
"""Writes a synthetic Qwen2-MoE checkpoint (the Hub layout save_pretrained writes: per-expert
tensors, sharded safetensors + index, config.json) for loading benchmarks, with the Python
standard library only (no numpy or torch needed).

    bench/make_checkpoint.py OUT_DIR [--preset config/models/qwen1.5-moe-a2.7b.json]
        [--set key=value ...] [--dtype bf16|f16|f32] [--shard-gb 5]

--set overrides config keys (ints, floats, true/false), e.g. a 0.6 GB model:
    --set hidden_size=1024 --set num_hidden_layers=4 --set num_experts=16 \
    --set moe_intermediate_size=512 --set shared_expert_intermediate_size=2048 \
    --set intermediate_size=2048 --set vocab_size=32000 --set num_attention_heads=8 \
    --set num_key_value_heads=8

Values are random with a weight-like magnitude (|x| ~ 2^-7 .. 2^-6, random signs and mantissas;
norms 1.0, biases small), cycled from a 16 MiB pattern at a different offset per tensor: what a
load benchmark reads is what a real checkpoint holds, byte for byte in size and layout. Prints
the size written."""
import argparse
import json
import os
import random
import struct
import sys

PATTERN_BYTES = 16 << 20


def parse_set(items):
    out = {}
    for kv in items:
        k, v = kv.split("=", 1)
        if v in ("true", "false"):
            out[k] = v == "true"
        else:
            try:
                out[k] = int(v)
            except ValueError:
                out[k] = float(v)
    return out


def tensors(c):
    """(name, shape, kind) in the order save_pretrained writes them; kind: w (matrix), n (norm), b (bias)."""
    H, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    nh, kvh = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or H // nh
    E, I, Is = c["num_experts"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]
    dense_I = c["intermediate_size"]
    step, mlp_only = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers", []))
    out = [("model.embed_tokens.weight", (V, H), "w")]
    for l in range(L):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (H,), "n"), (p + "post_attention_layernorm.weight", (H,), "n")]
        for nm, rows in (("q_proj", nh * hd), ("k_proj", kvh * hd), ("v_proj", kvh * hd)):
            out += [(p + f"self_attn.{nm}.weight", (rows, H), "w"), (p + f"self_attn.{nm}.bias", (rows,), "b")]
        out.append((p + "self_attn.o_proj.weight", (H, nh * hd), "w"))
        sparse = l not in mlp_only and E > 0 and (l + 1) % step == 0
        if sparse:
            out.append((p + "mlp.gate.weight", (E, H), "w"))
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                out += [(q + "gate_proj.weight", (I, H), "w"), (q + "up_proj.weight", (I, H), "w"),
                        (q + "down_proj.weight", (H, I), "w")]
            if Is:
                q = p + "mlp.shared_expert."
                out += [(q + "gate_proj.weight", (Is, H), "w"), (q + "up_proj.weight", (Is, H), "w"),
                        (q + "down_proj.weight", (H, Is), "w"), (p + "mlp.shared_expert_gate.weight", (1, H), "w")]
        else:
            q = p + "mlp."
            out += [(q + "gate_proj.weight", (dense_I, H), "w"), (q + "up_proj.weight", (dense_I, H), "w"),
                    (q + "down_proj.weight", (H, dense_I), "w")]
    out.append(("model.norm.weight", (H,), "n"))
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H), "w"))
    return out


def pattern(dtype, rng):
    """PATTERN_BYTES of little-endian values of |x| in [2^-7, 2^-5), random signs and mantissas."""
    raw = bytearray(rng.randbytes(PATTERN_BYTES))
    if dtype == "bf16":  # high byte: sign, exponent bits 7..1 = 0x3c (2^-7..2^-6 with the low bit)
        raw[1::2] = bytes((b & 0x80) | 0x3C for b in raw[1::2])
    elif dtype == "f16":  # high byte: sign, exponent 01000 (2^-7) + 2 random mantissa bits
        raw[1::2] = bytes((b & 0x83) | 0x20 for b in raw[1::2])
    else:  # f32: top byte sign + 0x3c (exponent 0x78/0x79)
        raw[3::4] = bytes((b & 0x80) | 0x3C for b in raw[3::4])
    return bytes(raw)


def const(dtype, value, n):
    if dtype == "bf16":
        return struct.pack("<f", value)[2:] * n
    if dtype == "f16":
        return struct.pack("<e", value) * n
    return struct.pack("<f", value) * n


def write_shard(path, items, dtype, pat, rng):
    es = {"bf16": 2, "f16": 2, "f32": 4}[dtype]
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in items:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype.upper(), "shape": list(shape), "data_offsets": [off, off + n * es]}
        off += n * es
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape, kind in items:
            n = 1
            for d in shape:
                n *= d
            nb = n * es
            if kind == "n":
                f.write(const(dtype, 1.0, n))
                continue
            if kind == "b":
                f.write(pat[:nb])
                continue
            start = rng.randrange(0, PATTERN_BYTES // es) * es
            while nb > 0:
                take = min(nb, PATTERN_BYTES - start)
                f.write(pat[start:start + take])
                nb -= take
                start = 0
    return 8 + len(h) + off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--preset", default="config/models/qwen1.5-moe-a2.7b.json")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    ap.add_argument("--shard-gb", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    c = json.load(open(a.preset))
    c.update(parse_set(a.set))
    for k in ("bos_token_id", "eos_token_id"):  # a smaller vocabulary keeps its special ids inside
        if isinstance(c.get(k), int) and c[k] >= c["vocab_size"]:
            c[k] = c["vocab_size"] - 1
    c["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[a.dtype]
    rng = random.Random(a.seed)
    pat = pattern(a.dtype, rng)
    es = {"bf16": 2, "f16": 2, "f32": 4}[a.dtype]
    shards, cur, cur_bytes, limit = [], [], 0, int(a.shard_gb * 1e9)
    for t in tensors(c):
        n = es
        for d in t[1]:
            n *= d
        if cur and cur_bytes + n > limit:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(t)
        cur_bytes += n
    shards.append(cur)
    os.makedirs(a.out, exist_ok=True)
    total, weight_map = 0, {}
    for i, items in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(a.out, name), items, a.dtype, pat, rng)
        for t in items:
            weight_map[t[0]] = name
        print(f"  {name}: {len(items)} tensors", file=sys.stderr, flush=True)
    if len(shards) > 1:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
                  open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)
    json.dump(c, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    print(f"{a.out}: {total / 1e9:.3f} GB in {len(shards)} file(s), {len(weight_map)} tensors, {a.dtype}")


if __name__ == "__main__":
    main()
