# benches/peers.gp - the plot of benches/peers.sh: each logger's write rate
# (MB/s, the writer held back by the logger) and CPU per GB, in bulk
# (64 KiB writes) and line (one write per 100-byte line) mode, side by side.
#   gnuplot -e "data='plot.dat'; out='peers.png'; title='...'" benches/peers.gp
# plot.dat (peers.sh writes it): '#' comment lines, then rows
#   MODE LOGGER WRITE_MBPS CPU_S_PER_GB     (medians over the repetitions)
if (!exists("data")) data = 'plot.dat'
if (!exists("out")) out = 'peers.png'
if (!exists("title")) title = 'logmon and its peers'
set terminal pngcairo size 1000,900 font ",11"
set output out
set datafile commentschars "#"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set key top right
set grid ytics
set yrange [0:*]
set xtics rotate by -30 noenhanced offset -1,0
# limit-null (the writer into /dev/null) would dwarf every bar: left out.
mode(m) = sprintf("< awk '$1 == \"%s\" && $2 != \"limit-null\"' '%s'", m, data)
set multiplot layout 2, 1 title title noenhanced font ",10"
set ylabel "write MB/s (median; higher is better)"
plot mode("bulk") using 3:xtic(2) title "bulk (64 KiB writes)", \
     mode("line") using 3 title "line (one write per 100-byte line)"
set ylabel "logger CPU s per GB (median; lower is better)"
set logscale y
set yrange [0.1:*]
plot mode("bulk") using 4:xtic(2) title "bulk", \
     mode("line") using 4 title "line"
unset multiplot
