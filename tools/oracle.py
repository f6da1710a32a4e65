#!/usr/bin/env python3
"""tools/oracle.py: the PyTorch oracle for the C trainer.

Owns: loading an llm.c-format GPT-2 model file into a PyTorch GPT-2 written out by hand in
float64 (the same maths as the C trainer), running a fixed batch for a few AdamW steps (AdamW,
the grad-norm clip and the learning-rate schedule written out by hand as well), and writing the
binary fixture that the C tests compare against. The format and how to regenerate it are in
docs/FIXTURE.md.

    python3 tools/oracle.py --model MODEL.bin --out FIXTURE.bin [--B 4 --T 32 --steps 10 ...]

--check also runs an independent reference built from torch.nn.functional blocks
(F.layer_norm, F.scaled_dot_product_attention, F.gelu(approximate='tanh'), F.cross_entropy)
and torch.optim.AdamW, compares losses, gradients and parameters with the hand-written model,
and re-reads the fixture it wrote; it exits non-zero on any mismatch.

Needs numpy and torch (CPU is enough; everything runs in float64 on the CPU).
"""
import argparse
import math
import os
import sys

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("oracle: torch is not installed for this python3 (it is on the GPU machine)", file=sys.stderr)
    sys.exit(1)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmc_format import MODEL_MAGIC, param_shapes  # noqa: E402
FIXTURE_MAGIC = 20261202
FIXTURE_VERSION = 1
HEADER_INTS = 256
LN_EPS = 1e-5

# Tensors that get weight decay (matmul weights and embeddings); all others (layernorm weights
# and biases, linear biases) get none.
DECAY = frozenset(["wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"])


def fail(msg):
    print(f"oracle: {msg}", file=sys.stderr)
    sys.exit(1)




# ----------------------------------------------------------------------------------------------
# model file


def load_model(path):
    """Returns (cfg dict, list of (name, float64 numpy array)) in llm.c order."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail(f"{path}: cannot read model file ({e.strerror})")
    if len(raw) < HEADER_INTS * 4:
        fail(f"{path}: too short for a model header ({len(raw)} bytes)")
    hdr = np.frombuffer(raw[:HEADER_INTS * 4], dtype="<i4")
    magic, version, maxT, V, L, NH, C, Vp = (int(x) for x in hdr[:8])
    if magic != MODEL_MAGIC:
        fail(f"{path}: bad magic {magic} (want {MODEL_MAGIC}): not an llm.c model file")
    if version not in (3, 5):
        fail(f"{path}: unsupported version {version} (want 3 for fp32 or 5 for bf16)")
    if min(maxT, V, L, NH, C, Vp) <= 0:
        fail(f"{path}: non-positive size in header (maxT={maxT} V={V} L={L} NH={NH} C={C} Vp={Vp})")
    if C % NH != 0:
        fail(f"{path}: C={C} is not divisible by NH={NH}")
    if Vp < V:
        fail(f"{path}: padded vocab Vp={Vp} is smaller than V={V}")
    shapes = param_shapes(maxT, L, C, Vp)
    n = sum(int(np.prod(s)) for _, s in shapes)
    width = 4 if version == 3 else 2
    want = HEADER_INTS * 4 + n * width
    if len(raw) != want:
        fail(f"{path}: size {len(raw)} bytes, header says {want} ({n} parameters, "
             f"{'fp32' if version == 3 else 'bf16'})")
    if version == 3:
        flat = np.frombuffer(raw, dtype="<f4", count=n, offset=HEADER_INTS * 4).astype(np.float64)
    else:
        bits = np.frombuffer(raw, dtype="<u2", count=n, offset=HEADER_INTS * 4).astype(np.uint32)
        flat = (bits << 16).view(np.float32).astype(np.float64)
    if not np.all(np.isfinite(flat)):
        fail(f"{path}: parameters contain NaN or infinity")
    params = []
    off = 0
    for name, shape in shapes:
        k = int(np.prod(shape))
        params.append((name, flat[off:off + k].reshape(shape).copy()))
        off += k
    cfg = dict(version=version, maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp, nparams=n)
    return cfg, params


# ----------------------------------------------------------------------------------------------
# the hand-written model (float64): every operation spelled out as the C trainer does it


def hand_layernorm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)  # biased variance, as in LayerNorm
    return xc / torch.sqrt(var + LN_EPS) * w + b


def hand_gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def hand_attention(qkv, NH):
    """qkv [B,T,3C] -> [B,T,C]; q, k, v are consecutive C-blocks, heads contiguous C/NH blocks."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH
    q = qkv[:, :, 0:C].reshape(B, T, NH, hs).permute(0, 2, 1, 3)
    k = qkv[:, :, C:2 * C].reshape(B, T, NH, hs).permute(0, 2, 1, 3)
    v = qkv[:, :, 2 * C:3 * C].reshape(B, T, NH, hs).permute(0, 2, 1, 3)
    scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hs))  # [B,NH,T,T]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    scores = scores - scores.max(dim=-1, keepdim=True).values.detach()
    e = torch.exp(scores)
    att = e / e.sum(dim=-1, keepdim=True)
    y = att @ v  # [B,NH,T,hs]
    return y.permute(0, 2, 1, 3).reshape(B, T, C)


def hand_forward(P, cfg, inputs, targets):
    """P: dict name -> float64 tensor in llm.c shapes. Returns (logits [B,T,Vp], mean loss)."""
    B, T = inputs.shape
    V = cfg["V"]
    x = P["wte"][inputs] + P["wpe"][:T]
    for l in range(cfg["L"]):
        h = hand_layernorm(x, P["ln1w"][l], P["ln1b"][l])
        qkv = h @ P["qkvw"][l].t() + P["qkvb"][l]
        y = hand_attention(qkv, cfg["NH"])
        x = x + (y @ P["attprojw"][l].t() + P["attprojb"][l])
        h = hand_layernorm(x, P["ln2w"][l], P["ln2b"][l])
        f = hand_gelu_tanh(h @ P["fcw"][l].t() + P["fcb"][l])
        x = x + (f @ P["fcprojw"][l].t() + P["fcprojb"][l])
    h = hand_layernorm(x, P["lnfw"], P["lnfb"])
    logits = h @ P["wte"].t()  # all Vp rows (tied weights)
    lg = logits[:, :, :V]  # the loss sees the first V columns only
    mx = lg.max(dim=-1, keepdim=True).values.detach()
    lse = torch.log(torch.exp(lg - mx).sum(dim=-1)) + mx.squeeze(-1)
    picked = lg.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    loss = (lse - picked).mean()
    return logits, loss


def lr_at(step, hp):
    """Cosine schedule with linear warmup (see docs/FIXTURE.md)."""
    lr, W, N = hp["lr"], hp["warmup"], hp["num_iterations"]
    min_lr = lr * hp["final_lr_frac"]
    if step < W:
        return lr * (step + 1) / W
    if N - W <= 0:
        return lr
    ratio = min(1.0, (step - W) / (N - W))
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (lr - min_lr)


def train_hand(params_np, cfg, inputs, targets, hp, steps):
    """Runs `steps` steps of forward, backward, clip and hand-written AdamW on the same batch.

    Returns a dict: logits0 [B,T,Vp] numpy, loss0, grads0 (list of numpy, unclipped, llm.c
    order), losses, lrs, norms, scales (lists), final params (list of numpy)."""
    names = [n for n, _ in params_np]
    P = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in params_np}
    m = {n: torch.zeros_like(P[n]) for n in names}
    v = {n: torch.zeros_like(P[n]) for n in names}
    b1, b2, eps, wd, clip = hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"], hp["grad_clip"]
    out = dict(losses=[], lrs=[], norms=[], scales=[])
    for s in range(steps):
        for n in names:
            P[n].grad = None
        logits, loss = hand_forward(P, cfg, inputs, targets)
        loss.backward()
        with torch.no_grad():
            sumsq = 0.0
            for n in names:
                sumsq += float((P[n].grad * P[n].grad).sum())
            norm = math.sqrt(sumsq)
            scale = min(1.0, clip / norm) if (clip > 0 and norm > 0) else 1.0
            lr_s = lr_at(s, hp)
            if s == 0:
                out["logits0"] = logits.detach().numpy().copy()
                out["loss0"] = float(loss.detach())
                out["grads0"] = [P[n].grad.numpy().copy() for n in names]
            out["losses"].append(float(loss.detach()))
            out["lrs"].append(lr_s)
            out["norms"].append(norm)
            out["scales"].append(scale)
            bc1 = 1.0 - b1 ** (s + 1)
            bc2 = 1.0 - b2 ** (s + 1)
            for n in names:
                p = P[n]
                g = p.grad * scale
                m[n] = b1 * m[n] + (1.0 - b1) * g
                v[n] = b2 * v[n] + (1.0 - b2) * g * g
                mhat = m[n] / bc1
                vhat = v[n] / bc2
                wd_p = wd if n in DECAY else 0.0
                p.sub_(lr_s * (mhat / (torch.sqrt(vhat) + eps) + wd_p * p))
    out["params"] = [P[n].detach().numpy().copy() for n in names]
    return out


# ----------------------------------------------------------------------------------------------
# the independent reference for --check: torch.nn.functional blocks, per-layer leaf tensors,
# torch.optim.AdamW with two parameter groups


def ref_attention(qkv, NH):
    B, T, C3 = qkv.shape
    C = C3 // 3
    hs = C // NH
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, hs).transpose(1, 2)
    k = k.view(B, T, NH, hs).transpose(1, 2)
    v = v.view(B, T, NH, hs).transpose(1, 2)
    if hasattr(F, "scaled_dot_product_attention"):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:  # torch < 2.0 (only for running the check on an old local torch)
        a = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hs)
        a = a.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf"))
        y = torch.matmul(F.softmax(a, dim=-1), v)
    return y.transpose(1, 2).contiguous().view(B, T, C)


class RefModel:
    """Per-layer leaf tensors built from the llm.c arrays; grads mapped back to llm.c order."""

    def __init__(self, params_np, cfg):
        self.cfg = cfg
        A = dict(params_np)
        t = lambda a: torch.tensor(a, dtype=torch.float64, requires_grad=True)  # noqa: E731
        self.wte, self.wpe = t(A["wte"]), t(A["wpe"])
        self.layers = []
        for l in range(cfg["L"]):
            self.layers.append({n: t(A[n][l]) for n in ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw",
                                                         "attprojb", "ln2w", "ln2b", "fcw", "fcb",
                                                         "fcprojw", "fcprojb")})
        self.lnfw, self.lnfb = t(A["lnfw"]), t(A["lnfb"])

    def named(self):
        yield "wte", self.wte
        yield "wpe", self.wpe
        for lay in self.layers:
            for n, p in lay.items():
                yield n, p
        yield "lnfw", self.lnfw
        yield "lnfb", self.lnfb

    def forward(self, inputs, targets):
        c = self.cfg
        B, T = inputs.shape
        C = c["C"]
        pos = torch.arange(T)
        x = F.embedding(inputs, self.wte) + F.embedding(pos, self.wpe)
        for lay in self.layers:
            h = F.layer_norm(x, (C,), lay["ln1w"], lay["ln1b"], eps=LN_EPS)
            y = ref_attention(F.linear(h, lay["qkvw"], lay["qkvb"]), c["NH"])
            x = x + F.linear(y, lay["attprojw"], lay["attprojb"])
            h = F.layer_norm(x, (C,), lay["ln2w"], lay["ln2b"], eps=LN_EPS)
            f = F.gelu(F.linear(h, lay["fcw"], lay["fcb"]), approximate="tanh")
            x = x + F.linear(f, lay["fcprojw"], lay["fcprojb"])
        h = F.layer_norm(x, (C,), self.lnfw, self.lnfb, eps=LN_EPS)
        logits = F.linear(h, self.wte)
        loss = F.cross_entropy(logits[:, :, :c["V"]].reshape(B * T, c["V"]), targets.reshape(B * T))
        return logits, loss

    def gather(self, what):
        """what(p) for every parameter, restacked into llm.c's order and shapes (numpy)."""
        L = self.cfg["L"]
        res = [what(self.wte), what(self.wpe)]
        for n in ("ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b", "fcw",
                  "fcb", "fcprojw", "fcprojb"):
            res.append(np.stack([what(self.layers[l][n]) for l in range(L)]))
        res += [what(self.lnfw), what(self.lnfb)]
        return res


def ref_lr(step, hp):
    """The schedule again, written independently of lr_at."""
    W, N, lr = hp["warmup"], hp["num_iterations"], hp["lr"]
    if step < W:
        return lr * float(step + 1) / float(W)
    r = 0.0 if N <= W else min(float(step - W) / float(N - W), 1.0)
    lo = lr * hp["final_lr_frac"]
    return lo + (lr - lo) * (1.0 + math.cos(r * math.pi)) / 2.0


def train_ref(params_np, cfg, inputs, targets, hp, steps):
    model = RefModel(params_np, cfg)
    decay = [p for n, p in model.named() if n in DECAY]
    nodecay = [p for n, p in model.named() if n not in DECAY]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": nodecay, "weight_decay": 0.0}],
                            lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    out = dict(losses=[], lrs=[], norms=[])
    allp = [p for _, p in model.named()]
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        logits, loss = model.forward(inputs, targets)
        loss.backward()
        norm = float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in allp])))
        if s == 0:
            out["logits0"] = logits.detach().numpy().copy()
            out["loss0"] = float(loss.detach())
            out["grads0"] = model.gather(lambda p: p.grad.detach().numpy().copy())
        if hp["grad_clip"] > 0 and norm > hp["grad_clip"]:
            with torch.no_grad():
                for p in allp:
                    p.grad.mul_(hp["grad_clip"] / norm)
        lr_s = ref_lr(s, hp)
        for g in opt.param_groups:
            g["lr"] = lr_s
        opt.step()
        out["losses"].append(float(loss.detach()))
        out["lrs"].append(lr_s)
        out["norms"].append(norm)
    out["params"] = model.gather(lambda p: p.detach().numpy().copy())
    return out


def maxdiff(xs, ys):
    """Largest absolute difference and largest absolute value over lists of arrays."""
    d = 0.0
    big = 0.0
    for x, y in zip(xs, ys):
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if x.shape != y.shape:
            return float("inf"), 0.0
        if x.size:
            d = max(d, float(np.max(np.abs(x - y))))
            big = max(big, float(np.max(np.abs(x))))
    return d, big


# ----------------------------------------------------------------------------------------------
# fixture


def f32_bits(x):
    return int(np.array([x], dtype="<f4").view("<i4")[0])


def write_fixture(path, cfg, a, hp, inputs, targets, positions, res):
    B, T, P = a.B, a.T, len(positions)
    V, Vp = cfg["V"], cfg["Vp"]
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[0:15] = [FIXTURE_MAGIC, FIXTURE_VERSION, B, T, a.steps, P, V, Vp, cfg["L"], cfg["C"],
                 cfg["NH"], cfg["maxT"], cfg["nparams"], hp["warmup"], hp["num_iterations"]]
    for i, key in enumerate(("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip",
                             "final_lr_frac")):
        hdr[32 + i] = f32_bits(hp[key])
    logits = res["logits0"].reshape(B * T, Vp)[positions, :V]
    grads = np.concatenate([g.ravel() for g in res["grads0"]])
    assert grads.size == cfg["nparams"]
    parts = [
        hdr,
        inputs.astype("<i4").ravel(),
        targets.astype("<i4").ravel(),
        np.asarray(positions, dtype="<i4"),
        logits.astype("<f4").ravel(),
        np.array([res["loss0"]], dtype="<f4"),
        grads.astype("<f4"),
        np.array(res["losses"], dtype="<f4"),
        np.array(res["lrs"], dtype="<f4"),
        np.array(res["norms"], dtype="<f4"),
    ]
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            for p in parts:
                f.write(p.tobytes())
        os.replace(tmp, path)
    except OSError as e:
        fail(f"{path}: cannot write fixture ({e.strerror})")


def read_fixture(path):
    """Parses a fixture back (used by --check; also documents the layout in code)."""
    with open(path, "rb") as f:
        raw = f.read()
    hdr = np.frombuffer(raw[:HEADER_INTS * 4], dtype="<i4")
    B, T, steps, P, V, Vp = (int(x) for x in hdr[2:8])
    n = int(hdr[12])
    fx = dict(hdr=hdr, floats=hdr[32:39].view("<f4"))
    off = HEADER_INTS * 4
    for key, dt, cnt in (("inputs", "<i4", B * T), ("targets", "<i4", B * T), ("positions", "<i4", P),
                         ("logits", "<f4", P * V), ("loss", "<f4", 1), ("grads", "<f4", n),
                         ("losses", "<f4", steps), ("lrs", "<f4", steps), ("norms", "<f4", steps)):
        fx[key] = np.frombuffer(raw, dtype=dt, count=cnt, offset=off)
        off += 4 * cnt
    fx["trailing"] = len(raw) - off
    return fx


# ----------------------------------------------------------------------------------------------


def run_check(a, cfg, params_np, hp, inputs_t, targets_t, positions, res, inputs, targets):
    print("check: independent reference (torch.nn.functional + torch.optim.AdamW), float64, "
          f"torch {torch.__version__}, sdpa={'yes' if hasattr(F, 'scaled_dot_product_attention') else 'no (fallback)'}")
    ref = train_ref(params_np, cfg, inputs_t, targets_t, hp, a.steps)
    ok = True

    def report(what, d, big, tol):
        nonlocal ok
        good = d <= tol
        ok = ok and good
        print(f"check: {what:<34} max|diff| {d:.3e} (max|value| {big:.3e}, tol {tol:.0e}) "
              f"{'OK' if good else 'FAIL'}")

    report("loss step 0", abs(res["loss0"] - ref["loss0"]), abs(res["loss0"]), 1e-10)
    report("logits step 0 (all Vp)", *maxdiff([res["logits0"]], [ref["logits0"]]), 1e-10)
    report("grads step 0 (unclipped)", *maxdiff(res["grads0"], ref["grads0"]), 1e-10)
    report("per-step losses", *maxdiff([res["losses"]], [ref["losses"]]), 1e-9)
    report("per-step grad norms", *maxdiff([res["norms"]], [ref["norms"]]), 1e-9)
    report("per-step lrs", *maxdiff([res["lrs"]], [ref["lrs"]]), 1e-15)
    report(f"params after {a.steps} AdamW steps", *maxdiff(res["params"], ref["params"]), 1e-9)
    moved, big = maxdiff(res["params"], [p for _, p in params_np])
    print(f"check: params moved by up to {moved:.3e} over the run (so the comparison is not vacuous)")
    ok = ok and moved > 1e-4
    pad = res["grads0"][0][cfg["V"]:]
    print(f"check: padded wte rows: max|grad| {float(np.max(np.abs(pad))) if pad.size else 0.0:.1e} "
          "(must be 0)")
    ok = ok and (pad.size == 0 or float(np.max(np.abs(pad))) == 0.0)

    fx = read_fixture(a.out)
    hdr = fx["hdr"]
    logits = res["logits0"].reshape(a.B * a.T, cfg["Vp"])[positions, :cfg["V"]]
    rt = (int(hdr[0]) == FIXTURE_MAGIC and int(hdr[1]) == FIXTURE_VERSION and fx["trailing"] == 0
          and np.array_equal(fx["inputs"], inputs.ravel()) and np.array_equal(fx["targets"], targets.ravel())
          and np.array_equal(fx["positions"], positions)
          and np.array_equal(fx["logits"], logits.astype(np.float32).ravel())
          and np.array_equal(fx["grads"], np.concatenate([g.ravel() for g in res["grads0"]]).astype(np.float32))
          and np.array_equal(fx["losses"], np.array(res["losses"], dtype=np.float32))
          and float(fx["floats"][0]) == hp["lr"] and float(fx["floats"][5]) == hp["grad_clip"])
    print(f"check: fixture re-read ({os.path.getsize(a.out)} bytes): {'OK' if rt else 'FAIL'}")
    ok = ok and rt
    print(f"check: {'PASSED' if ok else 'FAILED'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description="PyTorch oracle: write a fixture for the C trainer's tests")
    ap.add_argument("--model", required=True, help="llm.c-format model file (fp32 or bf16)")
    ap.add_argument("--out", required=True, help="fixture file to write")
    ap.add_argument("--B", type=int, default=4, help="batch size")
    ap.add_argument("--T", type=int, default=32, help="sequence length")
    ap.add_argument("--steps", type=int, default=10, help="AdamW steps on the same batch")
    ap.add_argument("--positions", type=int, default=8, help="number of positions whose logits are kept")
    ap.add_argument("--seed", type=int, default=1234, help="numpy default_rng seed for tokens and positions")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight_decay", type=float, default=0.1)
    ap.add_argument("--grad_clip", type=float, default=0.7,
                    help="0 disables clipping; default 0.7, not 1.0: a tiny random model has norms ~0.6-0.8")
    ap.add_argument("--warmup", type=int, default=2, help="warmup steps W of the schedule")
    ap.add_argument("--num_iterations", type=int, default=10, help="N: the schedule's length")
    ap.add_argument("--final_lr_frac", type=float, default=0.1, help="min lr = lr * this")
    ap.add_argument("--allow_no_clip", action="store_true",
                    help="accept settings under which clipping never triggers (default: refuse)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: reproducible)")
    ap.add_argument("--check", action="store_true",
                    help="also compare against an independent torch.nn.functional + torch.optim reference")
    a = ap.parse_args()

    for name in ("B", "T", "steps", "threads"):
        if getattr(a, name) <= 0:
            fail(f"--{name} must be positive, got {getattr(a, name)}")
    if a.warmup < 0 or a.num_iterations < 0:
        fail("--warmup and --num_iterations must be non-negative")
    if not (0.0 <= a.beta1 < 1.0 and 0.0 <= a.beta2 < 1.0):
        fail("--beta1 and --beta2 must lie in [0, 1)")
    if a.lr < 0 or a.eps <= 0 or a.weight_decay < 0 or a.grad_clip < 0 or a.final_lr_frac < 0:
        fail("--lr, --weight_decay, --grad_clip, --final_lr_frac must be >= 0 and --eps > 0")

    torch.set_num_threads(a.threads)
    cfg, params_np = load_model(a.model)
    if a.T > cfg["maxT"]:
        fail(f"--T {a.T} exceeds the model's maxT {cfg['maxT']}")
    if not 0 <= a.positions <= a.B * a.T:
        fail(f"--positions {a.positions} must lie in [0, B*T={a.B * a.T}]")

    # Hyper-parameters as float32 values: the fixture stores float32, so the oracle uses exactly
    # the numbers that the C side will read back.
    hp = {k: float(np.float32(getattr(a, k))) for k in
          ("lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "final_lr_frac")}
    hp["warmup"] = a.warmup
    hp["num_iterations"] = a.num_iterations

    rng = np.random.default_rng(a.seed)
    tokens = rng.integers(0, cfg["V"], size=(a.B, a.T + 1))
    positions = np.sort(rng.choice(a.B * a.T, size=a.positions, replace=False)).astype(np.int64)
    inputs = tokens[:, :a.T]
    targets = tokens[:, 1:]
    inputs_t = torch.tensor(inputs, dtype=torch.long)
    targets_t = torch.tensor(targets, dtype=torch.long)

    print(f"oracle: model {a.model}: {'fp32' if cfg['version'] == 3 else 'bf16'} L={cfg['L']} C={cfg['C']} "
          f"NH={cfg['NH']} maxT={cfg['maxT']} V={cfg['V']} Vp={cfg['Vp']} nparams={cfg['nparams']}")
    print(f"oracle: B={a.B} T={a.T} steps={a.steps} P={a.positions} seed={a.seed} lr={a.lr} "
          f"betas=({a.beta1},{a.beta2}) eps={a.eps} wd={a.weight_decay} clip={a.grad_clip} "
          f"W={a.warmup} N={a.num_iterations} f={a.final_lr_frac}")
    res = train_hand(params_np, cfg, inputs_t, targets_t, hp, a.steps)
    clipped = 0
    for s in range(a.steps):
        c = res["scales"][s] < 1.0
        clipped += c
        print(f"oracle: step {s:2d} loss {res['losses'][s]:.12f} lr {res['lrs'][s]:.6e} "
              f"norm {res['norms'][s]:.6e}{'  clipped x%.6f' % res['scales'][s] if c else ''}")
    if clipped == 0 and not a.allow_no_clip:
        fail(f"--grad_clip {a.grad_clip} never triggers (norms {min(res['norms']):.4g}..{max(res['norms']):.4g}); "
             "lower it so the fixture exercises clipping, or pass --allow_no_clip")
    write_fixture(a.out, cfg, a, hp, inputs, targets, positions, res)
    print(f"oracle: wrote {a.out} ({os.path.getsize(a.out)} bytes); clipping triggered in {clipped} of {a.steps} steps")
    if a.check and not run_check(a, cfg, params_np, hp, inputs_t, targets_t, positions, res, inputs, targets):
        sys.exit(1)


if __name__ == "__main__":
    main()
