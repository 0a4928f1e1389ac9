# Runs ${BENCH} --quick and checks that its last stdout line has the format
# the issue specifies (per FORMAT, below), and that bad usage exits 2. Timing
# values are not checked.
execute_process(COMMAND ${BENCH} --quick --reps=1
  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${BENCH} --quick exited with ${rc}:\n${out}")
endif()
# Bad usage exits 2 naming the flag (common/flags.h, as every binary).
foreach(bad "--reps=0" "--no-such-flag" "extra")
  execute_process(COMMAND ${BENCH} ${bad} OUTPUT_QUIET ERROR_VARIABLE err RESULT_VARIABLE bad_rc)
  if(NOT bad_rc EQUAL 2 OR NOT err MATCHES "error: ")
    message(FATAL_ERROR "${BENCH} ${bad} exited with ${bad_rc} (expected 2 and an error):\n${err}")
  endif()
endforeach()
string(STRIP "${out}" out)
string(REGEX REPLACE "^.*\n" "" last_line "${out}")
set(number "[0-9]+(\\.[0-9]+)?")
# FORMAT selects the benchmark: muon_batch (muonshard-bench-muon-batch),
# blocked_ns (muonshard-bench-blocked-ns) or,
# by default, muonshard-bench-kernels.
if(FORMAT STREQUAL "blocked_ns")
  set(pattern "^blocked_ns_s=${number} whole_ns_s=${number} ratio=${number}$")
elseif(FORMAT STREQUAL "muon_batch")
  set(pattern "^muon_batch_gflops=${number} per_matrix_gflops=${number} ratio=${number}$")
else()
  set(pattern "^ns_cpu_gflops=${number} sgemm_gflops=${number} ratio=${number}$")
endif()
if(NOT last_line MATCHES "${pattern}")
  message(FATAL_ERROR "unexpected last line: '${last_line}'\nfull output:\n${out}")
endif()
message(STATUS "last line ok: ${last_line}")
