#!/usr/bin/env python3
"""tools/pytorch_train_d12.py: PyTorch replays our trainer's run from an llm.c checkpoint.

Owns: loading an llm.c model file (fp32 version 3 or bf16 version 5) into per-layer fp32 leaf
tensors, reading the same llm.c token shard in our trainer's order with --shuffle 0, and
training with our trainer's exact recipe, so that the per-step losses can be compared
(test/test_gpu_vs_pytorch.sh). Named d12 after the GPU test; any model file works.

  data   step s (0-based) of batch B uses global rows s*B .. s*B+B-1; row g is position
         p = g % nrows with nrows = (ntok - 1) // T, i.e. tokens[p*T : p*T + T + 1] (inputs the
         first T, targets the last T). One shard, one process, no gradient accumulation.
  model  GPT-2: tied wte [Vp, C] (the logits cover all Vp rows), wpe, pre-LayerNorm blocks
         (eps 1e-5), causal attention (F.scaled_dot_product_attention where torch has it),
         GELU (tanh), 4C MLP; loss = mean cross-entropy over the first V logit columns.
  dtype  --dtype bf16: fp32 parameters under torch.autocast(bfloat16) (what people do in
         PyTorch); --dtype fp32: plain fp32 with TF32 off.
  step   grad norm = sqrt(sum of squares of every gradient, summed in float64); scale =
         clip/norm when clip > 0 and norm > clip, else 1; AdamW (decoupled decay only on wte,
         wpe, qkvw, attprojw, fcw, fcprojw), by hand in our trainer's operation order:
           g = grad*scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
           w -= lr * ((m/bc1) / (sqrt(v/bc2) + eps) + wd*w), bc = 1 - b^t
         (--adamw torch uses torch.optim.AdamW with two groups instead, as a cross-check).
  lr     cosine with linear warmup W over N steps: s < W: lr*(s+1)/W; else min_lr +
         0.5*(1 + cos(pi*(s-W)/(N-W)))*(lr - min_lr), min_lr = lr*frac (rounded to fp32 as
         our trainer does).

Prints one line per step and, with --json OUT, writes {"losses": [...], "lrs": [...],
"norms": [...], "ms": [...], "config": {...}}. The flag names are our trainer's.

    python3 tools/pytorch_train_d12.py --model ckpt.bin --input_bin shard.bin --batch_size 8 \\
        --sequence_length 1024 --num_iterations 20 --learning_rate 6e-4 --warmup_iters 5 \\
        --learning_rate_decay_frac 0.1 --weight_decay 0.1 --grad_clip 1.0 --json losses.json
"""
import argparse
import json
import math
import os
import struct
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("pytorch_train_d12: torch is not installed for this python3", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmc_format import MODEL_MAGIC, param_shapes  # noqa: E402
SHARD_MAGIC = 20240520
HEADER_BYTES = 256 * 4
LN_EPS = 1e-5
DECAY = frozenset(["wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"])
LAYER_NAMES = ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
               "fcw", "fcb", "fcprojw", "fcprojb")


def fail(msg):
    print(f"pytorch_train_d12: {msg}", file=sys.stderr)
    sys.exit(1)


def f32(x):
    """x rounded to float32, as a python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def read_file(path, what):
    try:
        with open(path, "rb") as f:
            return bytearray(f.read())
    except OSError as e:
        fail(f"{what} {path}: cannot read ({e.strerror})")


# ------------------------------------------------------------------------------------------------
# llm.c files


def load_model(path, device):
    """Returns (cfg, params): params is a list of (name, layer or -1, fp32 leaf tensor)."""
    raw = read_file(path, "--model")
    if len(raw) < HEADER_BYTES:
        fail(f"--model {path}: too short for a model header ({len(raw)} bytes)")
    h = [int(x) for x in torch.frombuffer(raw, dtype=torch.int32, count=8)]
    magic, version, maxT, V, L, NH, C, Vp = h
    if magic != MODEL_MAGIC:
        fail(f"--model {path}: bad magic {magic} (want {MODEL_MAGIC}): not an llm.c model file")
    if version not in (3, 5):
        fail(f"--model {path}: unsupported version {version} (want 3 = fp32 or 5 = bf16)")
    if min(maxT, V, L, NH, C, Vp) <= 0 or C % NH != 0 or Vp < V:
        fail(f"--model {path}: bad shape in header (maxT {maxT} V {V} L {L} NH {NH} C {C} Vp {Vp})")
    shapes = param_shapes(maxT, L, C, Vp)
    n = sum(math.prod(s) for _, s in shapes)
    width = 4 if version == 3 else 2
    if len(raw) != HEADER_BYTES + n * width:
        fail(f"--model {path}: {len(raw)} bytes, the header says {HEADER_BYTES + n * width} "
             f"({n} parameters, {'fp32' if version == 3 else 'bf16'})")
    flat = torch.frombuffer(raw, dtype=torch.float32 if version == 3 else torch.bfloat16,
                            offset=HEADER_BYTES, count=n)
    if not bool(torch.isfinite(flat).all()):
        fail(f"--model {path}: parameters contain NaN or infinity")
    params = []
    off = 0
    for name, shape in shapes:
        k = math.prod(shape)
        t = flat[off:off + k].to(torch.float32).reshape(shape)
        off += k
        if name in LAYER_NAMES:
            for l in range(L):
                params.append((name, l, t[l].clone().to(device).requires_grad_(True)))
        else:
            params.append((name, -1, t.clone().to(device).requires_grad_(True)))
    cfg = dict(version=version, maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp, nparams=n)
    return cfg, params


def load_shard(path, V):
    raw = read_file(path, "--input_bin")
    if len(raw) < HEADER_BYTES:
        fail(f"--input_bin {path}: too short for a shard header ({len(raw)} bytes)")
    magic, version, ntok = (int(x) for x in torch.frombuffer(raw, dtype=torch.int32, count=3))
    if magic != SHARD_MAGIC or version != 1:
        fail(f"--input_bin {path}: bad magic/version {magic}/{version} (want {SHARD_MAGIC}/1)")
    if ntok < 1 or len(raw) < HEADER_BYTES + 2 * ntok:
        fail(f"--input_bin {path}: header says {ntok} tokens but the file holds "
             f"{(len(raw) - HEADER_BYTES) // 2}")
    tok = torch.frombuffer(raw, dtype=torch.int16, offset=HEADER_BYTES, count=ntok)
    tok = tok.to(torch.int64) & 0xFFFF  # uint16 ids
    if int(tok.max()) >= V:
        fail(f"--input_bin {path}: token id {int(tok.max())} >= vocabulary size {V}")
    return tok


def batch(tok, step, B, T):
    """Our trainer's rows s*B .. s*B+B-1 with --shuffle 0 (wrapping at the end of the epoch)."""
    nrows = (tok.numel() - 1) // T
    rows = []
    for b in range(B):
        p = (step * B + b) % nrows
        rows.append(tok[p * T:p * T + T + 1])
    d = torch.stack(rows)
    return d[:, :T].contiguous(), d[:, 1:].contiguous()


# ------------------------------------------------------------------------------------------------
# the model


def attention(qkv, NH):
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH
    q, k, v = qkv.split(C, dim=2)
    q = q.reshape(B, T, NH, hs).transpose(1, 2)
    k = k.reshape(B, T, NH, hs).transpose(1, 2)
    v = v.reshape(B, T, NH, hs).transpose(1, 2)
    if hasattr(F, "scaled_dot_product_attention"):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:  # torch < 2.0 (the local CPU smoke test)
        a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(T, T, dtype=torch.bool, device=qkv.device).triu(1)
        a = F.softmax(a.masked_fill(mask, float("-inf")), dim=-1)
        y = a.to(v.dtype) @ v
    return y.transpose(1, 2).reshape(B, T, C)


def forward(P, cfg, inputs, targets):
    """P: {name: tensor} for globals, {name: [L tensors]} for per-layer tensors."""
    B, T = inputs.shape
    C, V = cfg["C"], cfg["V"]
    x = F.embedding(inputs, P["wte"]) + P["wpe"][:T]
    for l in range(cfg["L"]):
        h = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], eps=LN_EPS)
        y = attention(F.linear(h, P["qkvw"][l], P["qkvb"][l]), cfg["NH"])
        x = x + F.linear(y, P["attprojw"][l], P["attprojb"][l])
        h = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], eps=LN_EPS)
        f = F.gelu(F.linear(h, P["fcw"][l], P["fcb"][l]), approximate="tanh")
        x = x + F.linear(f, P["fcprojw"][l], P["fcprojb"][l])
    h = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], eps=LN_EPS)
    logits = F.linear(h, P["wte"])  # all Vp rows of the tied embedding
    lg = logits[:, :, :V].reshape(B * T, V).float()  # the loss sees the first V columns only
    return F.cross_entropy(lg, targets.reshape(B * T))


def lr_at(step, a):
    """Our trainer's lr_at_step (zero/optimizer.c), cosine schedule, rounded to fp32."""
    W, N, lr = a.warmup_iters, a.num_iterations, a.learning_rate
    if step < W:
        return f32(f32(lr) * f32(float(step + 1) / W))
    if N <= W:
        return f32(lr)
    min_lr = f32(lr) * f32(a.learning_rate_decay_frac)
    ratio = min(1.0, (step - W) / (N - W))
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return f32(min_lr + coeff * (f32(lr) - min_lr))


# ------------------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="llm.c model file (version 3 fp32 or 5 bf16)")
    p.add_argument("--input_bin", required=True, help="ONE llm.c token shard (no glob)")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--sequence_length", type=int, default=1024)
    p.add_argument("--num_iterations", type=int, default=20)
    p.add_argument("--learning_rate", type=float, default=6e-4)
    p.add_argument("--warmup_iters", type=int, default=5)
    p.add_argument("--learning_rate_decay_frac", type=float, default=0.1)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"],
                   help="bf16 = torch.autocast(bfloat16) over fp32 params; fp32 = plain fp32, TF32 off")
    p.add_argument("--adamw", default="hand", choices=["hand", "torch"],
                   help="AdamW written out in our trainer's order, or torch.optim.AdamW")
    p.add_argument("--json", default="", help="write the per-step losses here")
    a = p.parse_args()

    B, T, N = a.batch_size, a.sequence_length, a.num_iterations
    if B < 1 or T < 1 or N < 1:
        fail("--batch_size, --sequence_length and --num_iterations must be positive")
    if a.warmup_iters < 0 or a.grad_clip < 0 or a.weight_decay < 0 or a.learning_rate < 0:
        fail("--warmup_iters, --grad_clip, --weight_decay and --learning_rate must not be negative")
    if not 0.0 <= a.learning_rate_decay_frac <= 1.0:
        fail("--learning_rate_decay_frac must be in [0, 1]")
    if a.device == "cuda" and not torch.cuda.is_available():
        fail("CUDA is not available to this torch (use --device cpu)")
    dev = a.device
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)  # nothing here is random; only to be safe

    cfg, params = load_model(a.model, dev)
    if T > cfg["maxT"]:
        fail(f"--sequence_length {T} exceeds the model's maximum sequence length {cfg['maxT']}")
    tok = load_shard(a.input_bin, cfg["V"])
    if tok.numel() < B * T + 1:
        fail(f"--input_bin {a.input_bin}: {tok.numel()} tokens, fewer than one batch needs ({B * T + 1})")
    P = {}
    for name, l, t in params:
        if l < 0:
            P[name] = t
        else:
            P.setdefault(name, []).append(t)
    leaves = [t for _, _, t in params]
    nrows = (tok.numel() - 1) // T
    print(f"pytorch_train_d12: torch {torch.__version__} | {dev} | {a.dtype}"
          f"{' autocast, fp32 params' if a.dtype == 'bf16' else ''} | model {a.model}: L {cfg['L']}, "
          f"NH {cfg['NH']}, C {cfg['C']}, maxT {cfg['maxT']}, V {cfg['V']} (padded {cfg['Vp']}), "
          f"{cfg['nparams']} parameters (file version {cfg['version']}) | data {nrows} rows of {T} | "
          f"B {B} | {N} steps | AdamW {a.adamw}", flush=True)

    # our trainer holds these as fp32
    b1, b2, eps, wd, clip = f32(a.beta1), f32(a.beta2), f32(a.eps), f32(a.weight_decay), f32(a.grad_clip)
    state = [(t, torch.zeros_like(t), torch.zeros_like(t), wd if name in DECAY else 0.0)
             for name, _, t in params]
    topt = None
    if a.adamw == "torch":
        dec = [t for name, _, t in params if name in DECAY]
        nod = [t for name, _, t in params if name not in DECAY]
        topt = torch.optim.AdamW([{"params": dec, "weight_decay": wd}, {"params": nod, "weight_decay": 0.0}],
                                 lr=a.learning_rate, betas=(b1, b2), eps=eps)
    use_amp = a.dtype == "bf16"
    out = dict(losses=[], lrs=[], norms=[], ms=[])
    for step in range(N):
        t0 = time.perf_counter()
        inputs, targets = batch(tok, step, B, T)
        inputs, targets = inputs.to(dev), targets.to(dev)
        for t in leaves:
            t.grad = None
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=use_amp):
            loss = forward(P, cfg, inputs, targets)
        loss.backward()
        with torch.no_grad():
            sq = torch.zeros((), dtype=torch.float64, device=dev)
            for t in leaves:
                sq += t.grad.double().square().sum()
            norm = math.sqrt(float(sq))
            scale = f32(clip / norm) if (clip > 0 and norm > clip) else 1.0
            lr = lr_at(step, a)
            if topt is not None:
                if scale != 1.0:
                    for t in leaves:
                        t.grad.mul_(scale)
                for g in topt.param_groups:
                    g["lr"] = lr
                topt.step()
            else:
                tt = step + 1
                bc1 = f32(1.0 - b1 ** tt)
                bc2 = f32(1.0 - b2 ** tt)
                for w, m, v, dec in state:
                    g = w.grad * scale if scale != 1.0 else w.grad
                    m.mul_(b1).add_(g, alpha=1.0 - b1)
                    v.mul_(b2).add_(g * g, alpha=1.0 - b2)
                    upd = (m / bc1) / ((v / bc2).sqrt() + eps)
                    if dec:
                        upd.add_(w, alpha=dec)
                    w.sub_(lr * upd)
        lossf = float(loss)
        if dev == "cuda":
            torch.cuda.synchronize()
        ms = 1000.0 * (time.perf_counter() - t0)
        if not math.isfinite(lossf):
            fail(f"step {step + 1}: loss is {lossf}")
        out["losses"].append(lossf)
        out["lrs"].append(lr)
        out["norms"].append(norm)
        out["ms"].append(round(ms, 3))
        print(f"step {step + 1:4d}/{N} | loss {lossf:.6f} | lr {lr:.3e} | norm {norm:.4f} | {ms:.1f} ms",
              flush=True)
    out["config"] = dict(model=a.model, input_bin=a.input_bin, B=B, T=T, num_iterations=N,
                         learning_rate=a.learning_rate, warmup_iters=a.warmup_iters,
                         learning_rate_decay_frac=a.learning_rate_decay_frac, weight_decay=wd,
                         grad_clip=clip, beta1=b1, beta2=b2, eps=eps, device=dev, dtype=a.dtype,
                         adamw=a.adamw, torch=torch.__version__)
    if a.json:
        try:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        except OSError as e:
            fail(f"--json {a.json}: cannot write ({e.strerror})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
