# tools/plot.gp — the four panels of tools/plot.sh, which sets: train, val
# (.dat files: step loss tokens_per_s peak_alloc_mb peak_reserved_mb lr
# grad_norm; step val_loss), out, title, nval and h_* (how many values each
# column has; a panel without data says so instead of failing).
set terminal pngcairo size 1500,1000 font "sans,11" noenhanced
set output out
set datafile missing "?"
set multiplot layout 2,2 title title font ",14"
set grid
set key top right opaque
set xlabel "step"
set xrange [*:*]

empty(what) = sprintf("set label 1 '%s: not in the log' at graph 0.5, 0.5 center; set xrange [0:1]; set yrange [0:1]; plot 2 notitle; unset label 1; set xrange [*:*]; set autoscale y", what)

# 1. loss
set title "loss"
set ylabel "cross-entropy loss"
p = ""
if (h_loss > 0) p = "train u 1:2 w l lw 1.5 lc rgb '#1f77b4' t 'train'"
if (nval > 0) p = p . (strlen(p) ? ", " : "") . "val u 1:2 w lp pt 7 ps 0.9 lw 2 lc rgb '#d62728' t 'val'"
if (strlen(p)) { eval("plot " . p) } else { eval(empty("loss")) }

# 2. throughput
set title "throughput"
set ylabel "tokens/s"
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set key bottom right
if (h_tps > 0) { plot train u 1:3 w l lw 1.5 lc rgb '#2ca02c' t 'tokens/s' } else { eval(empty("tokens_per_s")) }
set autoscale y

# 3. memory
set title "peak memory"
set ylabel "MB"
set yrange [0:*]
p = ""
if (h_alloc > 0) p = "train u 1:4 w l lw 2 lc rgb '#9467bd' t 'peak allocated'"
if (h_res > 0) p = p . (strlen(p) ? ", " : "") . "train u 1:5 w l lw 2 dt 2 lc rgb '#ff7f0e' t 'peak reserved'"
if (strlen(p)) { eval("plot " . p) } else { eval(empty("peak memory")) }
set autoscale y

# 4. learning rate and gradient norm
set key top right
set title "learning rate and gradient norm"
set ylabel "learning rate"
set format y "%.1e"
set ytics nomirror
set yrange [0:*]
if (h_gn > 0) { set y2label "gradient norm"; set y2tics; set y2range [0:*] }
p = ""
if (h_lr > 0) p = "train u 1:6 axes x1y1 w l lw 2 lc rgb '#17becf' t 'lr'"
if (h_gn > 0) p = p . (strlen(p) ? ", " : "") . "train u 1:7 axes x1y2 w l lw 1 lc rgb '#7f7f7f' t 'grad norm (right axis)'"
if (strlen(p)) { eval("plot " . p) } else { eval(empty("lr and grad_norm")) }

unset multiplot
