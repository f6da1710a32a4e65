#!/usr/bin/env python3
"""tools/fuzz/make_seeds.py — writes the fuzzing seed corpus, test/fuzz/<harness>/seed_*:
small valid and near-valid token shards, model files (a tiny shape: maxT 8, V 16,
L 1, NH 1, C 4), tokenizer files and checkpoint state files (the tiny shape of
tools/fuzz/fuzz_checkpoint.c), built from the formats as documented (llm.c's headers;
checkpoint/checkpoint.h and the CKPT_H_* slots of checkpoint/checkpoint.c).
Deterministic: running it again rewrites the same bytes.
    python3 tools/fuzz/make_seeds.py [OUTDIR]      (default test/fuzz)"""
import os
import random
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "test", "fuzz")
rng = random.Random(20261203)


def put(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data)


def header_i32(vals):
    h = list(vals) + [0] * (256 - len(vals))
    return struct.pack("<256i", *h)


# ---- token shards ----
def shard(ntok_header, tokens):
    return header_i32([20240520, 1, ntok_header]) + struct.pack("<%dH" % len(tokens), *tokens)


toks = [rng.randrange(50257) for _ in range(200)]
put("shard", "valid_200.bin", shard(200, toks))
put("shard", "min_17.bin", shard(17, toks[:17]))
put("shard", "zero_tokens.bin", shard(0, []))
put("shard", "bad_token.bin", shard(20, toks[:19] + [65535]))
put("shard", "truncated.bin", shard(100, toks[:50]))
put("shard", "too_long.bin", shard(10, toks[:30]))
put("shard", "short_header.bin", header_i32([20240520, 1, 5])[:100])


# ---- model files ----
def n_params(maxT, V, Vp, L, NH, C):
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


def model(maxT, V, Vp, L, NH, C, version=3, poison=None):
    P = n_params(maxT, V, Vp, L, NH, C)
    w = [rng.gauss(0, 0.02) for _ in range(P)]
    if poison is not None:
        w[poison] = float("nan")
    h = header_i32([20240326, version, maxT, V, L, NH, C, Vp])
    if version == 3:
        return h + struct.pack("<%df" % P, *w)
    bits = [struct.unpack("<I", struct.pack("<f", x))[0] >> 16 for x in w]
    return h + struct.pack("<%dH" % P, *bits)


put("model", "fp32.bin", model(8, 16, 16, 1, 1, 4))
put("model", "bf16.bin", model(8, 16, 16, 1, 1, 4, version=5))
put("model", "nan.bin", model(8, 16, 16, 1, 1, 4, poison=5))
put("model", "padded_vocab.bin", model(4, 13, 16, 1, 1, 4))
put("model", "two_layers.bin", model(4, 8, 8, 2, 2, 4))
put("model", "truncated.bin", model(8, 16, 16, 1, 1, 4)[:1500])


# ---- tokenizer files ----
def tokenizer(version, pieces, eot=None):
    vals = [20240328, version, len(pieces)] + ([eot] if version == 2 else [])
    body = b"".join(bytes([len(p)]) + p for p in pieces)
    return struct.pack("<256I", *(vals + [0] * (256 - len(vals)))) + body


pieces = [bytes([0x61 + i]) for i in range(16)] + [" the".encode(), "é".encode(), "€".encode()[:2], b"\xff", "<|endoftext|>".encode()]
put("tokenizer", "v2.bin", tokenizer(2, pieces, eot=len(pieces) - 1))
put("tokenizer", "v1.bin", tokenizer(1, pieces))
put("tokenizer", "utf8_split.bin", tokenizer(2, ["€".encode()[:1], "€".encode()[1:], "😀".encode(), b"\x00"], eot=0))
put("tokenizer", "truncated.bin", tokenizer(2, pieces, eot=3)[:1100])
put("tokenizer", "eot_out_of_range.bin", tokenizer(2, pieces, eot=99))

# ---- checkpoint state files (the tiny shape of fuzz_checkpoint.c) ----
TINY = dict(maxT=8, V=16, Vp=16, L=1, NH=1, C=4)
P = n_params(TINY["maxT"], TINY["V"], TINY["Vp"], TINY["L"], TINY["NH"], TINY["C"])


def f32bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def state(step=12, t=11, master=None, v=None, magic=20261203):
    s = [0] * 128
    s[0:4] = [magic, 1, 1024, P]
    s[4:8] = [step, step * 8, t, 1]          # step, next_row, AdamW t, bad streak
    s[8:14] = [TINY["maxT"], TINY["V"], TINY["Vp"], TINY["L"], TINY["NH"], TINY["C"]]
    s[14:25] = [8, 7, 1, 1000, 64, 2, 4, 1, 100, 0, 2]   # T, seed, shuffle, rows, total batch, B, world, zero, iters, schedule, warmup
    s[25:32] = [f32bits(x) for x in (3e-4, 0.1, 0.1, 0.9, 0.95, 1e-8, 1.0)]
    s[32] = 0
    master = master or [rng.gauss(0, 0.02) for _ in range(P)]
    m = [rng.gauss(0, 1e-3) for _ in range(P)]
    v = v or [abs(rng.gauss(0, 1e-6)) for _ in range(P)]
    return struct.pack("<128Q", *s) + struct.pack("<%df" % (3 * P), *(master + m + v))


put("checkpoint", "valid.bin", state())
put("checkpoint", "bad_magic.bin", state(magic=12345))
put("checkpoint", "t_above_step.bin", state(step=3, t=4))
put("checkpoint", "nan_master.bin", state(master=[float("nan")] + [0.0] * (P - 1)))
put("checkpoint", "negative_v.bin", state(v=[-1.0] + [0.0] * (P - 1)))
put("checkpoint", "truncated.bin", state()[:3000])
put("checkpoint", "log.jsonl", b'{"step":0,"val_loss":5}\n{"step":1,"loss":4}\n{"step":5,"loss":3}\n{"step":5,"val_loss":2}\n{"step":6,"loss":1}\n')
put("checkpoint", "done.txt", b"gpt2-checkpoint v1\nstep 12\nmodel.bin 2416 crc32 0123abcd\nstate.bin 17728 crc32 89abcdef\n")
print("seeds written under", os.path.normpath(OUT))
