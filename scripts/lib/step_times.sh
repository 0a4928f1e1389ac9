# shellcheck shell=bash
# Sourced by the GPU scripts that time muonshard-worker runs.
#
# step_rows LOG: one line per progress line of a worker log ("step 3/10
# loss ...  step 12.3 ms (reduce ..., orthogonalise ..., adamw ..., sync ...
# ms)"): "STEP MS REDUCE ORTHOGONALISE ADAMW SYNC".
step_rows() {
  grep -E 'step [0-9]+/[0-9]+ .* ms' "$1" |
    sed -nE 's/.*step ([0-9]+)\/[0-9]+ .*step ([0-9.]+) ms  \(reduce ([0-9.]+), orthogonalise ([0-9.]+), adamw ([0-9.]+), sync ([0-9.]+) ms\).*/\1 \2 \3 \4 \5 \6/p'
}

# median_step_ms LOG: the median step time of LOG's steps after the first
# (CUDA/cuBLAS warm-up, first allocations); nothing when it has none.
median_step_ms() {
  step_rows "$1" | awk '$1 > 1 { print $2 }' | sort -g |
    awk '{ t[NR] = $1 } END { if (NR > 0) printf "%.3f\n", (NR % 2) ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2 }'
}
