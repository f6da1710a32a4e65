#!/usr/bin/env python3
"""tools/sass_frag_check.py — check in the machine code that A fragments held in
registers over a kernel's loop are never overwritten inside it.

The Hopper attention backward reads K's and V's rows as wgmma A fragments once
(ldmatrix, LDSM in the SASS) and uses them at every tile. ptxas 13.0 once
allocated other values into such registers (the forward's P packed over Q's
fragments after S's product, when the loop gained a branch): wrong results
that only the multi-tile checks of test_kernels_gpu caught. This names the
cause directly: the registers the first LDSM instructions of each matching
function load must not be the destination of any instruction before that
function's last HGMMA.

    cuobjdump -sass build/kernels/cuda/attention_sm90.cu.o | \\
        python3 tools/sass_frag_check.py attn_bwd_sm90 32

arguments: a substring of the function names to check, the number of
fragment registers (4 per LDSM). Prints one line per function (and each
offending instruction); exits 1 if any function has one, 2 if none matched.
"""
import re
import sys

# instructions that write no general register as their first operand
NO_DEST = ("ST", "RED", "HGMMA", "BRA", "BAR", "WARP", "DEPBAR", "MEMBAR", "FENCE", "ERRBAR", "CGAERRBAR", "CCTL",
           "EXIT", "NOP", "BSYNC", "BSSY", "LDGSTS", "LDGDEPBAR", "RET", "CALL", "ISETP", "FSETP", "PLOP3", "VOTE",
           "R2UR", "U")


def functions(lines):
    cur = None
    out = {}
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            out[cur] = []
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if cur and m:
            out[cur].append(m.group(1).strip())
    return out


def check(ins, nregs):
    """(the fragment registers, the instructions that write one of them)"""
    last = max((i for i, s in enumerate(ins) if "HGMMA" in s), default=-1)
    frag, bad = set(), []
    for s in ins[:last]:
        t = s.split()
        if t and t[0].startswith("@"):
            t = t[1:]
        if len(t) < 2:
            continue
        op, dst = t[0], re.match(r"R(\d+)", t[1])
        if op.startswith("LDSM") and len(frag) < nregs and dst:
            frag |= set(range(int(dst.group(1)), int(dst.group(1)) + 4))
        elif frag and dst and not op.startswith(NO_DEST) and int(dst.group(1)) in frag:
            bad.append(s)
    return frag, bad


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    name, nregs = sys.argv[1], int(sys.argv[2])
    found, failed = 0, 0
    for fn, ins in functions(sys.stdin).items():
        if name not in fn:
            continue
        found += 1
        frag, bad = check(ins, nregs)
        ok = len(frag) == nregs and not bad
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {fn}: {len(frag)} fragment registers"
              f" (R{min(frag) if frag else '-'}..), {len(bad)} written inside the loop")
        for s in bad[:10]:
            print("     ", s)
    if not found:
        print(f"sass_frag_check: no function matches '{name}'")
        sys.exit(2)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
