# benches/peers.gp - the plot of benches/peers.sh: each logger's write rate
# (MB/s, the writer held back by the logger) and CPU per GB, in bulk
# (64 KiB writes) and line (one write per 100-byte line) mode, side by side:
# the bar is the median of the repetitions, the whisker spans the lowest
# to the highest.
#   gnuplot -e "data='plot.dat'; out='peers.png'; title='...'" benches/peers.gp
# plot.dat (peers.sh writes it): '#' comment lines, then rows
#   MODE LOGGER WRITE_MBPS CPU_S_PER_GB WRITE_MIN WRITE_MAX CPU_MIN CPU_MAX
if (!exists("data")) data = 'plot.dat'
if (!exists("out")) out = 'peers.png'
if (!exists("title")) title = 'logmon and its peers'
set terminal pngcairo size 1000,1000 font ",11"
set output out
set datafile commentschars "#"
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set bars 2
# The legend sits above each plot, never over a bar.
set key outside top center horizontal
set grid ytics
set xtics rotate by -30 noenhanced offset -1,0
# limit-null (the writer into /dev/null) would dwarf every bar: left out.
mode(m) = sprintf("< awk '$1 == \"%s\" && $2 != \"limit-null\"' '%s'", m, data)
all = sprintf("< awk '$1 !~ /^#/ && $2 != \"limit-null\"' '%s'", data)
# The log axis starts a decade below the smallest CPU figure, so every bar
# shows (a bar below the floor would silently vanish).
stats all using 7 nooutput
floor = 10 ** floor(log10(STATS_min) - 1e-9)
set multiplot layout 2, 1 title title noenhanced font ",10"
set yrange [0:*]
set ylabel "write MB/s (bar: median; whisker: min-max; higher is better)"
plot mode("bulk") using 3:5:6:xtic(2) title "bulk (64 KiB writes)", \
     mode("line") using 3:5:6 title "line (one write per 100-byte line)"
set ylabel "logger CPU s per GB (log scale; lower is better)"
set logscale y
set yrange [floor:*]
plot mode("bulk") using 4:7:8:xtic(2) title "bulk", \
     mode("line") using 4:7:8 title "line"
unset multiplot
