#!/usr/bin/env bash
# tests/doc-blocks.sh FENCE PAGE... -- print the code blocks of one fence.
#
# Prints the body of every ```FENCE block of the given Markdown pages, in
# order, each after a line `# PAGE:LINE` (the line of its opening fence),
# with the fence's indentation removed: a script of the pages' examples of
# that kind. tests/systemd-real/run.sh runs the `sh-systemd` blocks this
# way; tests/it/docs.rs says what each fence means and checks that this
# extractor finds exactly the blocks its own parser finds.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 FENCE PAGE..." >&2; exit 2; }
fence=$1
shift
for page in "$@"; do
    awk -v fence="$fence" -v page="$page" '
        # state: 0 outside a block, 1 inside a block of FENCE, 2 inside another
        state == 0 && match($0, /^ *```/) {
            indent = RLENGTH - 3
            info = substr($0, RLENGTH + 1)
            sub(/^[ \t]+/, "", info)
            sub(/[ \t].*$/, "", info)
            state = (info == fence) ? 1 : 2
            if (state == 1) printf "# %s:%d\n", page, NR
            next
        }
        state != 0 && /^ *```[ \t]*$/ { state = 0; next }
        state == 1 {
            line = $0
            for (n = 0; n < indent && substr(line, 1, 1) == " "; n++) line = substr(line, 2)
            print line
        }
    ' "$page"
done
