# benches/ship-node.gp - the plot of benches/ship-node.sh: each shipper's lag
# behind the files over one run (one repetition), seconds and bytes, with its
# CPU per GB in the legend and the commit in the title.
#
#   gnuplot -e "dir='RESULTS'; png='OUT.png'; commit='HASH'[; rep=N]" benches/ship-node.gp
#
# Reads RESULTS/samples-{logmon,rsyslog}-rN.tsv (t_s, phase w = writing / c =
# catching up, written_bytes, shipped_bytes, lag_bytes, lag_s, …) and
# RESULTS/summary.tsv (CPU s/GB, lag p50/p99, catch-up of repetition N,
# default 1).

if (!exists("dir")) dir = "."
if (!exists("png")) png = dir . "/ship-node.png"
if (!exists("commit")) commit = "?"
if (!exists("rep")) rep = 1

file(s) = sprintf("%s/samples-%s-r%d.tsv", dir, s, rep)
has(s) = system(sprintf("test -s '%s' && echo 1 || echo 0", file(s))) + 0
col(s, c) = system(sprintf("awk -F'\\t' '$1 == %d && $2 == \"%s\" {print $%d}' '%s/summary.tsv'", rep, s, c, dir))
# The machine's load is said as measured: all CPUs busy (/proc/stat) and
# the part the tasks and their logmons took. (What is left over for
# "others" is a difference of two samplings and can come out negative:
# not shown.)
label(s) = sprintf("%s: %s s CPU/GB, lag p50 %s s, p99 %s s, caught up %s s after the last write; machine %s %% busy (tasks and logmons %s %%)", \
    s eq "logmon" ? "logmon ship" : "rsyslog imfile", col(s, 12), col(s, 13), col(s, 14), col(s, 18), col(s, 23), col(s, 22))
writes = system(sprintf("awk -F'\\t' '$1 == %d {print $4; exit}' '%s/summary.tsv'", rep, dir))
shape = system(sprintf("awk -F'\\t' '$1 == %d {printf \"%%s tasks, %%.0f MB in %%.0f s\", $3, $5 / 1e6, $4; exit}' '%s/summary.tsv'", rep, dir))

set terminal pngcairo size 1200,860 font ",10"
set output png
set datafile separator "\t"
set key top left box opaque
set grid
set xlabel "seconds since the tasks started writing"
set arrow 1 from first writes, graph 0 to first writes, graph 1 nohead dashtype 2 lc rgb "gray40"
set label 1 "last write" at first writes, graph 0.97 right offset -0.5, 0 textcolor rgb "gray40"
shippers = "logmon rsyslog"
colour(s) = s eq "logmon" ? "#1f77b4" : "#d62728"

set multiplot layout 2, 1 title sprintf("Shipping a busy node (%s): logmon ship -> nats-server vs rsyslog imfile -> TCP (benches/ship-node.sh, commit %s)", shape, commit)
set ylabel "lag, seconds (log)"
# Below the plot, one line per shipper: never over a curve.
set key outside bottom center vertical Left reverse noopaque nobox
# (The lower plot's x axis is the same and says what it is.)
unset xlabel
set logscale y
set yrange [0.01:*]
plot for [s in shippers] (has(s) ? file(s) : "/dev/null") \
    using 1:($6 > 0.01 ? $6 : 0.01) with lines lw 2 lc rgb colour(s) title (has(s) ? label(s) : "")
unset logscale y
set key inside top left box opaque Right noreverse
set xlabel "seconds since the tasks started writing"
set yrange [0:*]
set ylabel "lag, MB not yet shipped"
plot for [s in shippers] (has(s) ? file(s) : "/dev/null") \
    using 1:($5 / 1e6) with lines lw 2 lc rgb colour(s) title (has(s) ? (s eq "logmon" ? "logmon ship" : "rsyslog imfile") : "")
unset multiplot
