#!/usr/bin/env python3
"""tools/sass_frag_check.py — check in the machine code that A fragments held in
registers over a kernel's loop are never overwritten inside it.

The Hopper attention backward reads K's and V's rows as wgmma A fragments once
(ldmatrix: LDSM in the SASS) and uses them at every tile. ptxas 13.0 once
allocated other values into such registers (the forward's P packed over Q's
fragments, held over its loop, when the loop gained a branch): wrong results
that only the multi-tile checks of test_kernels_gpu caught. This names the
cause directly: in each matching function, the registers that its first LDSM
instructions load must not be written by any instruction from there to the
end of the loop (the backward branch with the lowest target after those
loads; without one, the function's last HGMMA). Every destination register of
an instruction counts: vector loads and wide multiplies write 2 or 4, an HGMMA
m64nN writes N/2 accumulators.

    cuobjdump -sass build/kernels/cuda/attention_sm90.cu.o | \\
        python3 tools/sass_frag_check.py attn_bwd_sm90 32

arguments: a substring of the function names to check and the number of
fragment registers (4 per LDSM .x4). It checks registers only: a fragment that
is dead inside the loop by design (the forward now reads Q's at each tile)
reports FAIL, so run it on kernels that hold their fragments. One line per
function (and its offending instructions); a function with no HGMMA (a build
without sm_90a code) is reported and skipped. Exit status: 0 all checked
functions pass, 1 one fails, 2 a usage error or no function with HGMMA matched.
"""
import re
import sys

# opcodes that write no general register (stores, control, predicate-only
# results): their first register operand is a source
NO_DEST = ("ST", "RED", "BRA", "BAR", "WARPGROUP", "WARPSYNC", "DEPBAR", "MEMBAR", "FENCE", "ERRBAR",
           "CGAERRBAR", "CCTL", "EXIT", "NOP", "BSYNC", "BSSY", "LDGSTS", "LDGDEPBAR", "RET", "CALL", "ISETP",
           "FSETP", "DSETP", "HSETP2", "PLOP3", "R2P")


def functions(lines):
    """{name: [(address, instruction text)]} in listing order"""
    cur, out = None, {}
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            while cur in out:  # the same name in two cubins
                cur += "'"
            out[cur] = []
            continue
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if cur is not None and m:
            out[cur].append((int(m.group(1), 16), m.group(2).strip()))
    return out


def split(text):
    """(opcode, operand list) without a leading predicate"""
    t = text.split(None, 1)
    if t and t[0].startswith("@"):
        t = t[1].split(None, 1) if len(t) > 1 else []
    if not t:
        return "", []
    return t[0], [o.strip() for o in t[1].split(",")] if len(t) > 1 else []


def dest_regs(op, ops):
    """the general registers an instruction writes (empty if none)"""
    if op.startswith(NO_DEST):
        return set()
    for o in ops:  # skip leading predicate destinations (PT, P0, ...)
        if re.fullmatch(r"!?U?P(T|\d+)", o):
            continue
        m = re.fullmatch(r"R(\d+)", o)
        if not m:
            return set()
        r = int(m.group(1))
        if op.startswith("HGMMA"):
            n = re.match(r"HGMMA\.64x(\d+)x", op)
            width = int(n.group(1)) // 2 if n else 1
        elif ".128" in op or op.startswith("LDSM") and op.endswith(".4"):
            width = 4
        elif ".64" in op or ".WIDE" in op or op.startswith("CS2R") or op.startswith("LDSM") and op.endswith(".2"):
            width = 2
        else:
            width = 1
        return set(range(r, r + width))
    return set()


def check(ins, nregs):
    """(fragment registers, offending instructions, whether the function has an HGMMA)"""
    if not any("HGMMA" in s for _, s in ins):
        return set(), [], False
    frag, loaded = set(), None  # loaded: the index of the last fragment load
    for i, (_, s) in enumerate(ins):
        op, ops = split(s)
        if op.startswith("LDSM") and len(frag) < nregs:
            frag |= dest_regs(op, ops)
            loaded = i
    if loaded is None:
        return frag, [], True
    # the loop's end: the last backward branch to the lowest target after the loads
    start_addr = ins[loaded][0]
    backs = []
    for i, (addr, s) in enumerate(ins):
        op, ops = split(s)
        if op == "BRA" and ops and re.fullmatch(r"0x[0-9a-f]+", ops[-1]):
            target = int(ops[-1], 16)
            if start_addr < target < addr:
                backs.append((target, i))
    if backs:
        lowest = min(t for t, _ in backs)
        end = max(i for t, i in backs if t == lowest)
    else:
        end = max(i for i, (_, s) in enumerate(ins) if "HGMMA" in s)
    bad = [s for _, s in ins[loaded + 1:end + 1] if dest_regs(*split(s)) & frag]
    return frag, bad, True


def main():
    if len(sys.argv) != 3 or not sys.argv[2].isdigit():
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    name, nregs = sys.argv[1], int(sys.argv[2])
    checked, failed = 0, 0
    for fn, ins in functions(sys.stdin).items():
        if name not in fn:
            continue
        frag, bad, has_mma = check(ins, nregs)
        if not has_mma:
            print(f"skip {fn}: no HGMMA (a build without sm_90a code)")
            continue
        checked += 1
        ok = len(frag) == nregs and not bad
        failed += not ok
        lo = f"R{min(frag)}.." if frag else "none"
        print(f"{'ok  ' if ok else 'FAIL'} {fn}: {len(frag)} fragment registers ({lo}),"
              f" {len(bad)} instructions inside the loop write them")
        for s in bad[:10]:
            print("     ", s)
    if not checked:
        print(f"sass_frag_check: no function with HGMMA matches '{name}'")
        sys.exit(2)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
