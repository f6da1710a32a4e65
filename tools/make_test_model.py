#!/usr/bin/env python3
"""tools/make_test_model.py: writes a small random GPT-2 model file in llm.c's format.

Owns: nothing but a throw-away model for testing the oracle (tools/oracle.py) and the C
loaders. Needs numpy only. The header is 256 little-endian int32 (see docs/FIXTURE.md);
the parameters follow in llm.c's order, fp32 (version 3) or bf16 (version 5).

Values: matmul weights and embeddings ~ N(0, std^2); layernorm weights 1 + N(0, ln_noise^2);
layernorm biases and linear biases ~ N(0, bias_std^2). The padded rows of wte (V..Vp-1) are
random too unless --zero_pad_rows: a trainer that wrongly lets them into the softmax then
shows a different loss.

Example:
    python3 tools/make_test_model.py --out /tmp/tiny.bin --L 2 --C 32 --NH 2 --maxT 64
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmc_format import MODEL_MAGIC, param_shapes  # noqa: E402


def fail(msg):
    print(f"make_test_model: {msg}", file=sys.stderr)
    sys.exit(1)




def to_bf16_bits(x32):
    """float32 array -> uint16 bf16 bits, round to nearest even (no NaNs expected)."""
    u = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def main():
    ap = argparse.ArgumentParser(description="write a random llm.c-format GPT-2 model file")
    ap.add_argument("--out", required=True, help="output model file")
    ap.add_argument("--L", type=int, default=2, help="layers")
    ap.add_argument("--C", type=int, default=32, help="channels")
    ap.add_argument("--NH", type=int, default=2, help="heads")
    ap.add_argument("--maxT", type=int, default=64, help="max sequence length")
    ap.add_argument("--V", type=int, default=50257, help="vocabulary size")
    ap.add_argument("--Vp", type=int, default=50304, help="padded vocabulary size")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--std", type=float, default=0.02, help="std of weights and embeddings")
    ap.add_argument("--ln_noise", type=float, default=0.05, help="std of layernorm weights around 1")
    ap.add_argument("--bias_std", type=float, default=0.02, help="std of all biases")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--zero_pad_rows", action="store_true", help="zero wte rows V..Vp-1")
    a = ap.parse_args()

    for name in ("L", "C", "NH", "maxT", "V", "Vp"):
        if getattr(a, name) <= 0:
            fail(f"--{name} must be positive, got {getattr(a, name)}")
    if a.C % a.NH != 0:
        fail(f"--C {a.C} is not divisible by --NH {a.NH}")
    if a.Vp < a.V:
        fail(f"--Vp {a.Vp} is smaller than --V {a.V}")

    rng = np.random.default_rng(a.seed)
    arrays = []
    for name, shape in param_shapes(a.maxT, a.L, a.C, a.Vp):
        if name in ("ln1w", "ln2w", "lnfw"):
            x = 1.0 + a.ln_noise * rng.standard_normal(shape)
        elif name.endswith("b"):
            x = a.bias_std * rng.standard_normal(shape)
        else:
            x = a.std * rng.standard_normal(shape)
        if name == "wte" and a.zero_pad_rows:
            x[a.V:, :] = 0.0
        arrays.append(x.astype(np.float32).ravel())
    flat = np.concatenate(arrays)

    hdr = np.zeros(256, dtype="<i4")
    hdr[:8] = [MODEL_MAGIC, 3 if a.dtype == "fp32" else 5, a.maxT, a.V, a.L, a.NH, a.C, a.Vp]
    body = flat.astype("<f4") if a.dtype == "fp32" else to_bf16_bits(flat).astype("<u2")
    try:
        with open(a.out, "wb") as f:
            f.write(hdr.tobytes())
            f.write(body.tobytes())
    except OSError as e:
        fail(f"{a.out}: cannot write ({e.strerror})")
    print(f"make_test_model: wrote {a.out}: {a.dtype} L={a.L} C={a.C} NH={a.NH} maxT={a.maxT} "
          f"V={a.V} Vp={a.Vp}, {flat.size} parameters")


if __name__ == "__main__":
    main()
