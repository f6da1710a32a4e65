#!/usr/bin/env python3
"""tools/bench_pytorch.py: the PyTorch side of the GPU throughput benchmark (tools/bench.sh).

Owns: a GPT-2 of the same architecture as our trainer, written with torch.nn (tied token
embedding of Vp = 50304 rows, learned positions, pre-LayerNorm blocks, causal attention through
F.scaled_dot_product_attention (flash attention on bf16 CUDA tensors), GELU (tanh), 4C MLP),
trained the way people train it in PyTorch: fp32 parameters under torch.autocast(bfloat16),
torch.optim.AdamW(fused=True, also on CPU where this torch has it) (lr 6e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the 2-D
tensors only), grad-norm clip 1.0, torch.compile(model). Random tokens, fresh each step.

Loss: like our trainer, the logits cover all Vp = 50304 rows of the tied embedding and the
cross-entropy sees only the first V = 50257 columns (--loss_vocab 50257, the default).
--loss_vocab 50304 is nanoGPT's choice (cross-entropy over all padded columns; the random
targets then never hit the padding, so the maths differs only in the softmax denominator).

Per batch size B: --warmup untimed steps (the first one compiles), then --steps timed steps,
each timed by CUDA events; the median step time gives tokens/s = B*T / median. Peak allocated
and peak reserved memory are taken over the timed steps (reset_peak_memory_stats before them;
model, optimizer state and activations are all live then). MFU uses our trainer's formula:
flops_per_token = 6*(12*L*C^2 + Vp*C) + 12*L*C*T, MFU = flops_per_token * tokens/s / 989e12
(H200 dense bf16).

One line per B on stdout; --json OUT writes {"B": {tokens_per_s, ms, ms_mean, mfu,
peak_alloc_mb, peak_reserved_mb}} (or {"B": {"error": "..."}} for a B that failed, e.g. OOM:
the other B values still run).

    python3 tools/bench_pytorch.py --model d12 --batch_size 16,32,64 --json /tmp/pt.json
    /usr/bin/python3 tools/bench_pytorch.py --device cpu --no_compile --model d2 --n_embd 32 \\
        --batch_size 2 --seq_len 32 --warmup 1 --steps 2          # a CPU smoke test
"""
import argparse
import gc
import json
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("bench_pytorch: torch is not installed for this python3", file=sys.stderr)
    sys.exit(1)

V_REAL = 50257
V_PADDED = 50304
PEAK_FLOPS_BF16 = 989e12


def parse_model(name, n_embd, n_head):
    if len(name) < 2 or name[0] != "d" or not name[1:].isdigit() or int(name[1:]) < 1:
        raise SystemExit(f"bench_pytorch: --model '{name}' is not a preset dN (N layers, 64N channels, N heads)")
    n = int(name[1:])
    L, C, NH = n, 64 * n, n
    if n_embd:
        C = n_embd
    if n_head:
        NH = n_head
    if C % NH != 0:
        raise SystemExit(f"bench_pytorch: channels {C} do not divide by heads {NH}")
    return L, C, NH


# ------------------------------------------------------------------------------------------------
# the model


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hs = C // self.NH
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0: only for smoke tests on an old local torch
            a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            a = F.softmax(a.masked_fill(mask, float("-inf")), dim=-1)
            y = a.to(v.dtype) @ v
        return self.attproj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, C, NH, maxT, Vp, loss_vocab):
        super().__init__()
        self.loss_vocab = loss_vocab
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # residual projections scaled down by sqrt(2L), as GPT-2 does
                s = std / math.sqrt(2 * L) if name.endswith(("attproj.weight", "fcproj.weight")) else std
                nn.init.normal_(p, mean=0.0, std=s)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        x = self.lnf(x)
        logits = F.linear(x, self.wte.weight)  # tied weights: [B, T, Vp]
        Vl = self.loss_vocab
        if Vl != logits.size(-1):
            logits = logits[:, :, :Vl]
        return F.cross_entropy(logits.reshape(B * T, Vl).float(), targets.reshape(B * T))


def make_optimizer(model, lr, wd, device, want_fused):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": nodecay, "weight_decay": 0.0}]
    if want_fused:
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True), "fused"
        except (TypeError, RuntimeError, ValueError) as e:
            print(f"bench_pytorch: fused AdamW unavailable ({e}); using the default implementation",
                  flush=True)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8), "default"


# ------------------------------------------------------------------------------------------------
# one batch size


def flops_per_token(L, C, Vp, T):
    return 6.0 * (12.0 * L * C * C + Vp * C) + 12.0 * L * C * T


def is_oom(e):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower() or \
        "can't allocate memory" in str(e)


def error_text(e):
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]


def bench_one(a, B, L, C, NH, compile_it):
    dev = a.device
    torch.manual_seed(1337)
    model = GPT(L, C, NH, a.max_seq_len, V_PADDED, a.loss_vocab).to(dev)
    opt, opt_kind = make_optimizer(model, a.lr, 0.1, dev, not a.no_fused)
    fwd = model
    if compile_it:
        if not hasattr(torch, "compile"):
            raise RuntimeError("this torch has no torch.compile (use --no_compile)")
        fwd = torch.compile(model, dynamic=False)
    use_amp = a.dtype == "bf16"
    T = a.seq_len

    def step():
        data = torch.randint(0, V_REAL, (B, T + 1), device=dev)
        x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=use_amp):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    for i in range(a.warmup):
        loss = step()
        if i == 0:
            first = float(loss)  # also waits for the first (compiling) step
            print(f"  B {B}: first step done after {time.perf_counter() - t0:.1f} s (loss {first:.4f})",
                  flush=True)
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times_ms = []
    if dev == "cuda":
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(a.steps)]
        for s, e in evs:
            s.record()
            loss = step()
            e.record()
        torch.cuda.synchronize()
        times_ms = [s.elapsed_time(e) for s, e in evs]
    else:
        for _ in range(a.steps):
            t = time.perf_counter()
            loss = step()
            float(loss)
            times_ms.append(1000.0 * (time.perf_counter() - t))
    last_loss = float(loss)
    if not math.isfinite(last_loss):
        raise RuntimeError(f"loss is not finite ({last_loss})")
    ms = statistics.median(times_ms)
    tps = B * T / (ms / 1000.0)
    res = {
        "tokens_per_s": round(tps, 1),
        "ms": round(ms, 3),
        "ms_mean": round(statistics.mean(times_ms), 3),
        "mfu": round(flops_per_token(L, C, V_PADDED, T) * tps / PEAK_FLOPS_BF16, 5) if dev == "cuda" else None,
        "peak_alloc_mb": None,
        "peak_reserved_mb": None,
        "last_loss": round(last_loss, 6),
        "optimizer": opt_kind,
        "compiled": compile_it,
    }
    if dev == "cuda":
        res["peak_alloc_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        res["peak_reserved_mb"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    return res


def cleanup(dev):
    gc.collect()
    if hasattr(torch, "_dynamo"):
        try:
            torch._dynamo.reset()  # drop compiled graphs: the next B compiles from scratch, static shapes
        except Exception:  # noqa: BLE001
            pass
    if dev == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="d12", help="dN: N layers, 64N channels, N heads (d12 = GPT-2 124M)")
    p.add_argument("--n_embd", type=int, default=0, help="override the preset's channels")
    p.add_argument("--n_head", type=int, default=0, help="override the preset's heads")
    p.add_argument("--max_seq_len", type=int, default=1024, help="rows of the position embedding")
    p.add_argument("--batch_size", default="16,32,64", help="comma- or space-separated list of B")
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first (the first compiles)")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--loss_vocab", type=int, default=V_REAL, choices=[V_REAL, V_PADDED],
                   help="cross-entropy over the first 50257 logit columns (as our trainer) or all 50304")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="bf16 = autocast, fp32 params")
    p.add_argument("--no_compile", action="store_true", help="skip torch.compile (eager)")
    p.add_argument("--no_fused", action="store_true", help="default AdamW instead of fused=True")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--threads", type=int, default=0, help="CPU: torch.set_num_threads (0 = torch's default)")
    a = p.parse_args()

    L, C, NH = parse_model(a.model, a.n_embd, a.n_head)
    try:
        Bs = [int(x) for x in a.batch_size.replace(",", " ").split()]
    except ValueError:
        raise SystemExit(f"bench_pytorch: --batch_size '{a.batch_size}' is not a list of integers")
    if not Bs or min(Bs) < 1:
        raise SystemExit("bench_pytorch: --batch_size needs positive integers")
    if a.seq_len < 1 or a.seq_len > a.max_seq_len:
        raise SystemExit(f"bench_pytorch: --seq_len {a.seq_len} must be in [1, {a.max_seq_len}]")
    if a.warmup < 1 or a.steps < 1:
        raise SystemExit("bench_pytorch: --warmup and --steps must be at least 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_pytorch: CUDA is not available to this torch (use --device cpu --no_compile)")
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        if hasattr(torch, "_dynamo"):
            try:
                torch._dynamo.config.automatic_dynamic_shapes = False
            except Exception:  # noqa: BLE001
                pass
        gpu = torch.cuda.get_device_name(0)
    else:
        if a.threads > 0:
            torch.set_num_threads(a.threads)
        gpu = f"cpu, {torch.get_num_threads()} threads"
    print(f"bench_pytorch: torch {torch.__version__} on {gpu} | {a.model}: L {L}, C {C}, NH {NH}, "
          f"Vp {V_PADDED}, loss over {a.loss_vocab} columns | T {a.seq_len} | {a.dtype}"
          f"{' autocast' if a.dtype == 'bf16' else ''} | compile {'off' if a.no_compile else 'on'} | "
          f"warmup {a.warmup}, timed {a.steps}", flush=True)

    results = {}
    for B in Bs:
        retry_eager = False
        try:
            results[str(B)] = bench_one(a, B, L, C, NH, not a.no_compile)
        except Exception as e:  # noqa: BLE001  (OOM or anything else: keep the other B values)
            results[str(B)] = {"error": error_text(e)}
            # a failed compile (not an OOM) falls back to eager, marked "compiled": false
            retry_eager = not a.no_compile and not is_oom(e)
        cleanup(a.device)
        if retry_eager:
            cerr = results[str(B)]["error"]
            print(f"B {B:4d} | torch.compile failed ({cerr}); retrying eager", flush=True)
            try:
                results[str(B)] = bench_one(a, B, L, C, NH, False)
                results[str(B)]["compile_error"] = cerr
            except Exception as e:  # noqa: BLE001
                results[str(B)] = {"error": "eager after a failed compile: " + error_text(e)}
            cleanup(a.device)
            a.no_compile = True  # it would fail again for the next B: don't spend the time
            print("bench_pytorch: the remaining batch sizes run eager", flush=True)
        r = results[str(B)]
        if "error" in r:
            print(f"B {B:4d} | FAILED: {r['error']}", flush=True)
        else:
            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
            mem = (f"peak {r['peak_alloc_mb']:.0f} MB alloc, {r['peak_reserved_mb']:.0f} MB reserved"
                   if r["peak_alloc_mb"] is not None else "peak memory n/a")
            print(f"B {B:4d} | {'' if r['compiled'] else 'EAGER | '}{r['ms']:.2f} ms/step median ({r['ms_mean']:.2f} mean) | "
                  f"{r['tokens_per_s']:.0f} tok/s | mfu {mfu} | {mem} | "
                  f"loss {r['last_loss']:.4f}", flush=True)
        if a.json:  # rewrite after each B: a later crash or timeout keeps what was measured
            if os.path.dirname(a.json):
                os.makedirs(os.path.dirname(a.json), exist_ok=True)
            with open(a.json + ".tmp", "w") as f:
                json.dump(results, f, indent=1)
            os.replace(a.json + ".tmp", a.json)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
