#!/usr/bin/env bash
# tools/plot.sh RUN_DIR — draws RUN_DIR/log.jsonl (the trainer's log, one JSON
# object a line) into RUN_DIR/plot.png with gnuplot (tools/plot.gp):
#   train and val loss, tokens/s, peak memory (allocated, reserved), and the
#   learning rate with the gradient norm, each against the step.
# Training lines hold "step" and "loss" (and lr, grad_norm, ms, tokens_per_s,
# mfu, peak_alloc_mb, peak_reserved_mb); validation lines "step" and
# "val_loss"; other lines are ignored. Parsed with awk (no jq needed).
# Installs gnuplot-nox with apt-get if gnuplot is missing. See docs/DATA.md.
set -euo pipefail
die() { echo "plot: error: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: tools/plot.sh RUN_DIR (reads RUN_DIR/log.jsonl, writes RUN_DIR/plot.png)"
RUN_DIR=${1%/}
LOG=$RUN_DIR/log.jsonl
[ -f "$LOG" ] || die "$LOG not found"
[ -r "$LOG" ] || die "$LOG is not readable"
HERE=$(cd "$(dirname "$0")" && pwd)

if ! command -v gnuplot >/dev/null; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    echo "plot: installing gnuplot-nox"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox ||
        { $sudo apt-get update -q && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox; } ||
        die "cannot install gnuplot-nox"
fi

TMP=$(mktemp -d /tmp/plot.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# One .dat line per log line: "?" marks a missing or non-numeric value.
awk -v train="$TMP/train.dat" -v val="$TMP/val.dat" '
    function num(key,   s) {
        if (!match($0, "\"" key "\"[ \t]*:[ \t]*[^,}]*")) return "?"
        s = substr($0, RSTART, RLENGTH)
        sub(/^[^:]*:[ \t]*/, "", s)
        gsub(/[ \t"]/, "", s)
        # a value that is there but not a finite number (NaN, Infinity, null) breaks the line
        return (s ~ /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/) ? s : "NaN"
    }
    {
        step = num("step")
        if (step == "?" || step == "NaN") next
        if (match($0, /"loss"[ \t]*:/)) {
            v[2] = num("loss"); v[3] = num("tokens_per_s"); v[4] = num("peak_alloc_mb")
            v[5] = num("peak_reserved_mb"); v[6] = num("lr"); v[7] = num("grad_norm")
            print step, v[2], v[3], v[4], v[5], v[6], v[7] > train
            for (c = 2; c <= 7; c++) if (v[c] != "?" && v[c] != "NaN") have[c]++
            if (v[2] == "NaN") bad++
            nt++
        }
        if (match($0, /"val_loss"[ \t]*:/)) { s = num("val_loss"); print step, s > val; if (s != "?" && s != "NaN") nv++ }
    }
    END { printf "%d %d", nt, nv; for (c = 2; c <= 7; c++) printf " %d", have[c]; printf " %d\n", bad }' "$LOG" >"$TMP/counts"
touch "$TMP/train.dat" "$TMP/val.dat"
read -r ntrain nval h_loss h_tps h_alloc h_res h_lr h_gn nbad <"$TMP/counts"
[ "$ntrain" -gt 0 ] || die "$LOG has no training lines (objects with \"step\" and \"loss\")"

# a summary for the title: last step, last losses, median tokens/s after the first step
last_step=$(tail -1 "$TMP/train.dat" | cut -d' ' -f1)
last_loss=$(tail -1 "$TMP/train.dat" | cut -d' ' -f2)
last_val=$(awk '$2 != "?" && $2 != "NaN" { v = $2 } END { print (v == "" ? "-" : v) }' "$TMP/val.dat")
median_tps=$(awk 'NR > 1 && $3 != "?" && $3 != "NaN" { print $3 }' "$TMP/train.dat" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR) printf "%.0f", v[int((NR + 1) / 2)]; else printf "-" }')
title="$(basename "$(cd "$RUN_DIR" && pwd)"): step $last_step, loss $last_loss, val loss $last_val, median $median_tps tokens/s"
[ "$nbad" -gt 0 ] && title="$title, $nbad steps with a non-finite loss"

gnuplot -e "train='$TMP/train.dat'; val='$TMP/val.dat'; out='$TMP/plot.png'; title='${title//\'/}'" \
    -e "nval=$nval; h_loss=$h_loss; h_tps=$h_tps; h_alloc=$h_alloc; h_res=$h_res; h_lr=$h_lr; h_gn=$h_gn" \
    "$HERE/plot.gp" 2>"$TMP/gnuplot.err" || { cat "$TMP/gnuplot.err" >&2; die "gnuplot failed"; }
[ -s "$TMP/plot.png" ] || die "gnuplot wrote no image: $(cat "$TMP/gnuplot.err")"
cp "$TMP/plot.png" "$RUN_DIR/plot.png.tmp.$$" && mv "$RUN_DIR/plot.png.tmp.$$" "$RUN_DIR/plot.png" ||
    die "cannot write $RUN_DIR/plot.png"
echo "plot: wrote $RUN_DIR/plot.png ($ntrain training steps, $nval validation points)"
