# benches/scale.gp - the cost curve of benches/scale.sh: the loggers' summed
# CPU, and their summed memory (PSS), against the number of tasks, one line
# per logger (log scale N).
#   gnuplot -e "data='curve.dat'; out='curve.png'; title='...'" benches/scale.gp
# curve.dat (scale.sh writes it): '#' comment lines, then rows
#   N LOGGER CPU_SECONDS CPU_PERCENT PSS_MIB   (PSS "-" when not sampled)
# loggers='logmon s6-log' (the default) names the lines, in that order; a
# logger missing from the data draws nothing.
if (!exists("data")) data = 'curve.dat'
if (!exists("out")) out = 'curve.png'
if (!exists("title")) title = 'logger CPU and memory against the number of tasks'
if (!exists("loggers")) loggers = 'logmon s6-log'
set terminal pngcairo size 900,900 font ",11"
set output out
set datafile missing "-"
rows(lg) = sprintf("< awk '$1 !~ /^#/ && $2 == \"%s\"' '%s'", lg, data)
set multiplot layout 2, 1 title title noenhanced
set logscale x 10
set xlabel "tasks (N), each with its own logger"
set key top left
set grid
set offsets graph 0.05, graph 0.05, graph 0.05, 0
set yrange [0:*]
set ylabel "logger CPU, seconds (summed over the N loggers)"
plot for [lg in loggers] rows(lg) using 1:3 with linespoints lw 2 pt 7 title lg
set ylabel "logger memory, MiB (PSS summed over the N loggers)"
plot for [lg in loggers] rows(lg) using 1:5 with linespoints lw 2 pt 7 title lg
unset multiplot
