#!/usr/bin/env bash
# test/test_sass_frag_check.sh — tools/sass_frag_check.py on hand-written
# listings in cuobjdump's format: the GPU suite runs it on the attention
# backward's real machine code, where a parser that missed a write would pass
# a miscompiled kernel. Each case is a small kernel: LDSM loads the fragments
# R152..R155, a loop (a backward branch to 0x0040) uses them in an HGMMA.
source "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
command -v python3 >/dev/null || { bad "python3 not found (tools/install_deps.sh installs it)"; finish test_sass_frag_check; exit 1; }

# listing NAME BODY...: a function whose loop body is the given instructions
listing() {
    local name="$1"; shift
    local a=16
    printf '\t\tFunction : %s\n' "$name"
    printf '        /*%04x*/                   LDSM.16.M88.4 R152, [R13] ;  /* 0x0 */\n' 0
    printf '        /*%04x*/                   MOV R1, R2 ;  /* 0x0 */\n' 32
    printf '        /*%04x*/                   HGMMA.64x64x16.F32.BF16 R24, R152, gdesc[UR16], RZ, !UPT, gsb0 ;  /* 0x0 */\n' 64
    a=80
    for ins in "$@"; do
        printf '        /*%04x*/                   %s ;  /* 0x0 */\n' "$a" "$ins"
        a=$((a + 16))
    done
    printf '        /*%04x*/               @P0 BRA 0x40 ;  /* 0x0 */\n' "$a"
    printf '        /*%04x*/                   FMUL R152, R1, R2 ;  /* 0x0 */\n' $((a + 16))
    printf '        /*%04x*/                   EXIT ;  /* 0x0 */\n' $((a + 32))
}
# expect CASE STATUS INSTRUCTIONS...: the tool's exit status on that loop body
expect() {
    local what="$1" want="$2"; shift 2
    listing _Z4kernv "$@" >"$TMP/l.sass"
    python3 tools/sass_frag_check.py kernv 4 <"$TMP/l.sass" >"$TMP/out" 2>&1
    local got=$?
    if [ "$got" = "$want" ]; then ok "$what (exit $got)"; else bad "$what: exit $got, wanted $want: $(cat "$TMP/out")"; fi
}
expect "untouched fragments (a write after the loop does not count)" 0 "FADD R30, R31, R32" "HGMMA.64x64x16.F32.BF16 R56, R152, gdesc[UR20], R56"
expect "a plain write inside the loop" 1 "MUFU.EX2 R154, R22"
expect "a predicated write" 1 "@!P1 F2FP.BF16.F32.PACK_AB R155, R16, R15"
expect "a 128-bit load over the fragments' first registers" 1 "LDS.128 R150, [R15+0x100]"
expect "a 64-bit load just below them" 0 "LDS.64 R150, [R15]"
expect "a wide multiply ending inside them" 1 "IMAD.WIDE R151, R17, UR6, R20"
expect "an MMA whose accumulators cover them" 1 "HGMMA.64x64x16.F32.BF16 R130, R160, gdesc[UR16], R130"
expect "an MMA whose accumulators end below them" 0 "HGMMA.64x64x16.F32.BF16 R120, R160, gdesc[UR16], R120"
expect "compares, which write predicates only" 0 "ISETP.GT.AND P3, PT, R152, R20, !P2" "FSETP.NEU.AND P0, PT, R153, 1, PT"
expect "a shuffle with a predicate destination first" 1 "SHFL.BFLY PT, R153, R2, 0x1, 0x1f"
expect "stores read them" 0 "STG.E desc[UR38][R20.64+0x50], R152" "STSM.16.M88.4 [R225+0x14000], R152"
# a function without MMA (a build without sm_90a code) is skipped, not failed
printf '\t\tFunction : _Z4kernv\n        /*0000*/                   EXIT ;  /* 0x0 */\n' >"$TMP/l.sass"
python3 tools/sass_frag_check.py kernv 4 <"$TMP/l.sass" >"$TMP/out" 2>&1
check "no HGMMA: skipped, exit 2 (nothing was checked)" test $? = 2
check "no HGMMA: the skip is printed" grep -q "^skip _Z4kernv" "$TMP/out"
python3 tools/sass_frag_check.py >/dev/null 2>&1
check "no arguments: usage error, exit 2" test $? = 2
finish test_sass_frag_check
