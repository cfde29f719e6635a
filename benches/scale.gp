# benches/scale.gp - the cost curve of benches/scale.sh: the loggers' summed
# CPU, and their summed memory (PSS), against the number of tasks, one line
# per logger (log scale N).
#   gnuplot -e "data='curve.dat'; out='curve.png'; title='...'" benches/scale.gp
# curve.dat (scale.sh writes it): '#' comment lines, then rows
#   N LOGGER CPU_SECONDS CPU_PERCENT PSS_MIB   (PSS "-" when not sampled)
# loggers='logmon s6-log' (the default) names the lines, in that order; a
# logger missing from the data draws nothing. ship='ship.dat' (scale.sh's
# part 3, when it ran: N SHIPPER CPU_S_PER_GB rows) adds a third panel,
# the shippers' CPU per GB over the largest N's files.
if (!exists("data")) data = 'curve.dat'
if (!exists("out")) out = 'curve.png'
if (!exists("title")) title = 'logger CPU and memory against the number of tasks'
if (!exists("loggers")) loggers = 'logmon s6-log'
if (!exists("ship")) ship = ''
has_ship = (ship ne '' && system(sprintf("test -s '%s' && echo 1 || echo 0", ship)) eq "1")
set terminal pngcairo size 900, (has_ship ? 1250 : 900) font ",11"
set output out
set datafile missing "-"
rows(lg) = sprintf("< awk '$1 !~ /^#/ && $2 == \"%s\"' '%s'", lg, data)
set multiplot layout (has_ship ? 3 : 2), 1 title title noenhanced
set logscale x 10
set xlabel "tasks (N), each with its own logger"
set key top left
set grid
set offsets graph 0.05, graph 0.05, graph 0.05, 0
set yrange [0:*]
set ylabel "CPU s, summed over the N loggers"
plot for [lg in loggers] rows(lg) using 1:3 with linespoints lw 2 pt 7 title lg
set ylabel "PSS MiB, summed over the N loggers"
plot for [lg in loggers] rows(lg) using 1:5 with linespoints lw 2 pt 7 title lg
if (has_ship) {
    unset logscale x
    unset offsets
    set style data histograms
    set style fill solid 0.8 border -1
    set boxwidth 0.6
    set xlabel sprintf("the shipper over the largest N's files (%s tasks)", system(sprintf("awk 'NR == 1 { print $1 }' '%s'", ship)))
    # Log scale, floor a decade below the smallest, each bar labelled with
    # its value: the shippers differ by ~70x, and on a linear axis the
    # smaller bar is a sliver.
    stats ship using 3 nooutput
    set logscale y
    set yrange [10 ** floor(log10(STATS_min) - 1e-9):10 ** ceil(log10(STATS_max) + 0.3)]
    set ylabel "CPU s per GB shipped (log scale)"
    unset key
    plot ship using 3:xtic(stringcolumn(2) eq "logmon" ? "logmon ship -> NATS" : "rsyslog imfile -> TCP") lc rgb "#2ca02c", \
         ship using ($0):3:(sprintf("%.2f", $3)) with labels offset 0,1 notitle
}
unset multiplot
