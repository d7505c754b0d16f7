#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The sanitizer and fuzzing stages of CI (scripts/test.sh runs them after the normal suite).
#
#   scripts/sanitizers.sh [asan] [tsan] [fuzz]      no argument: all three, in that order
#
#   asan  clang -fsanitize=address,undefined (LeakSanitizer on), build-asan: the core suite
#   tsan  gcc -fsanitize=thread, build-tsan: a smaller core suite (TSan is 5-15x slower)
#   fuzz  clang libFuzzer + ASan/UBSan, the same build-asan (its objects carry the fuzzers'
#         coverage instrumentation too): every committed corpus input once, then each target
#         for CHORUS_FUZZ_SECONDS seconds (default 12); tests/fuzz/README.md
#
# One instrumented build serves ASan and the fuzzers: the fuzz stage only compiles and links
# the fuzz targets (a separate fuzz build of the whole library took 5-6 minutes of CI's 60).
# The fuzzers' coverage instrumentation (-fsanitize=fuzzer-no-link) is in the library's layers
# but not its kernels, and not in the tests (cmake/ChorusSanitizers.cmake): it changes no
# behaviour, and kept out of the reduction loops it costs the test suite little time.
#
# Environment: CHORUS_FUZZ_SECONDS; CHORUS_SAN_JOBS (build and ctest parallelism, default
# nproc). Benchmarks and examples are not built. Any sanitizer report fails the test that
# produced it (halt_on_error, abort_on_error); suppressions are in tests/sanitizers/ (third-party
# false positives only, each explained there).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=${CHORUS_SAN_JOBS:-$(nproc)}
fuzz_seconds=${CHORUS_FUZZ_SECONDS:-12}
supp=$root/tests/sanitizers

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(asan tsan fuzz)
for s in "${stages[@]}"; do
  case "$s" in
    asan | tsan | fuzz) ;;
    *) echo "sanitizers.sh: unknown stage '$s' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
done

# ---- What runs under the sanitizers -----------------------------------------------------------
# The core suite: ctest labels unit, ranks and mp (which includes the fault tests), except
#   - the whole-library script checks (abi:exports reads the shared library's symbol table,
#     dropin:* preloads it into a client built against another libnccl.so.2,
#     install:* builds an uninstrumented consumer against the installed library, netns:* needs
#     network namespaces): they say nothing about memory or threads;
#   - both: the whole default-choice matrix ("<Coll> matrix with N ranks", 1M-element counts):
#     the per-algorithm matrix runs every algorithm of every collective with 1-8 ranks, and the
#     normal stage runs the default-choice matrix;
#   - both: the multi-process matrices at a second rank count of the same transport (shared
#     memory with 4 ranks, TCP with 2, UCX with 2 over tcp and 4 over shared memory): the other
#     rank count of each runs, and the normal stage runs them all;
#   - TSan: the frozen-peer fault test, which asserts when the timeout fires (within 100 ms
#     before and 5 s after CHORUS_TIMEOUT_MS), a timing that TSan's slowdown does not keep;
#   - TSan: the UCX tests: libucx is not instrumented and runs threads of its own, so TSan
#     cannot see its synchronisation (ASan runs them);
#   - TSan: the multi-process matrices that vary only a transport's protocol (shared memory with
#     2 ranks, by reference or not, mapped registered buffers, chunks over 3 paths): each rank
#     process drives them from one thread, so they hold no race that the remaining ones (3
#     ranks, automatic transports, host streams with their threads, registered buffers on host
#     streams) do not; ASan and the normal stage run them all;
#   - TSan: the compressed collectives' error-bound matrices (threads with 2-8 ranks, processes
#     over shared memory): each operation quantizes on the one thread that drives it; the
#     compressed checks that share state across threads (volume counters, error feedback, the
#     transparent mode, the matrix over TCP) still run;
#   - ASan: of those matrices, the one on threads (2-8 ranks, 3.5 minutes under ASan) and the
#     processes over shared memory (40-100 s each): the same codec, kind and count cases run in
#     processes over TCP with 3 ranks (the flat compressed algorithms) and on 2 x 2 simulated
#     hosts (the hierarchical one, shared memory within the hosts), and the normal stage runs
#     them all;
#   - ASan: the ring and chain split over several channels on threads (90 s): the multi-process
#     matrices with chunks over 3 paths (TCP, shared memory) run the chunk layer's splitting
#     under ASan. TSan (81 s, the stage's longest test) drops it too since 2026-12-06: the
#     channels of one rank are fibers of the one thread that drives it, so the split adds no
#     thread; the rank threads' races are those of every other test on threads, and the normal
#     stage runs it;
#   - both: the repeats among the tests on simulated hosts (mp:*hosts*): ASan keeps the matrix
#     with the hierarchical algorithms forced on 3 x 2 hosts, the pipelined AllReduce, Broadcast
#     and Reduce, the Broadcast and Reduce from every root on 3 x 2 hosts, the tree algorithms
#     on round-robin hosts and the compressed collectives on 2 x 2 hosts (the other shapes run
#     the same code with other counts); TSan, looking for races between threads, which the
#     hierarchical algorithms do not add (their stages are fibers of the one thread that drives
#     the operation), keeps none of them (the matrix went too, 2026-12-06, when the whole CI
#     run reached 60.5 minutes: 33 s under TSan for a kind of race that every other
#     multi-process matrix, with the same progress thread beside the caller, already looks for);
#   - TSan: the per-algorithm matrices with 2, 3 and 5 ranks of their 1, 2, 3, 4, 5, 8
#     (CHORUS_TEST_RANK_COUNTS): one rank has no peer to race with, and 4 and 8 ranks add
#     threads doing what they do with 2, 3 and 5 (8, 5 to 15x slower under TSan, is most of
#     the matrices' time); the normal stage runs them all;
#   - ASan: the same matrices with 1, 2, 3, 4 and 8 ranks of their 1, 2, 3, 4, 5, 8: one rank
#     alone, the powers of two, and 3 for a count one rank beyond a power of two (what the
#     halving and Bruck algorithms fold in); 5 is that case again, with the most threads after
#     8, and the normal stage runs it;
#   - TSan: the small-message algorithms' matrices on threads other than AllReduce's and
#     AlltoAll's: every collective moves its messages through the same box code
#     (transports/small_box.cc), whose races those two (a fold, every pair both ways) exercise;
#     ASan and the normal stage run them all;
#   - both: the launcher and layering checks (a shell script around chorus-run, and builds of
#     probe files), which exercise no instrumented code, and the tools' checks (tools:, scripts
#     around chorus-info, which these builds do not build).
# and with fewer datatypes (CHORUS_TEST_DATATYPES, tests/support/coll_check.h): the transports
# and algorithms depend on the element size only, and every datatype's kernels are checked
# by the unit tests. ASan keeps the smallest and the largest element size (int8, double), since
# an out-of-bounds access can depend on it, and float, which the compressed matrices need
# (half, between int8 and float, ran too until the stage outgrew its time); TSan, 5-15x slower
# and looking for races, which do not, float only (the compressed matrices keep float among
# their float, bfloat16 and half). Under ASan the pipelined hierarchical Broadcast and Reduce
# also run on two host layouts of their three, which between them plan every stage shape, with
# fewer datatypes (CHORUS_TEST_NARROW, tests/mp/mp_test.cc).
# Measured in CI on 2 cores (2026-12-04): ASan 20.6 minutes (8 of them its tests), TSan 14.
# 2026-12-06, a slower run (every stage 7-25 % above its usual): ASan 18.3 minutes (8.9 its
# tests), TSan 13.8 (8.2); then TSan's tests alone, with the two exclusions above, 6.6 minutes.
core_tests=(chorus_unit_tests chorus_ranks_tests chorus_mp_tests chorus_mp_worker
            chorus_fault_tests)
core_labels='^(unit|ranks|mp)$'
not_instrumented='^(abi|install|dropin|example|netns|launcher|layers|tools):'
default_matrix='^ranks:.* matrix with [0-9]+ ranks$'
second_rank_count='^mp:multi-process matrix (over shared memory with 4|over TCP with 2|over UCX \(tcp\) with 2|over UCX \(shared memory\) with 4) ranks$'
compress_repeats='^(ranks:compressed collectives are within|mp:compressed collectives over shared memory|ranks:ring and chain split over several channels$)'
host_repeats='^mp:(AllReduce is bit-identical on every rank on .*(hosts|ranks)$|multi-process matrix on 2 hosts x 2 ranks$|multi-process matrix, hierarchical algorithms forced, on 2 hosts x 3 ranks$|hierarchical Broadcast from every root on 2 hosts x 2 ranks$|hierarchical Reduce from every root on 2 hosts x 2 ranks$)'
host_tsan='^mp:(hierarchical AllReduce in pipelined pieces|compressed collectives on 2 hosts|hierarchical Broadcast |hierarchical Reduce |multi-process matrix, [a-z]+ algorithms forced|tree Broadcast |tree Reduce )'
asan_exclude="$not_instrumented|$default_matrix|$second_rank_count|$compress_repeats|$host_repeats"
asan_datatypes=int8,float,double
protocol_variants='^mp:multi-process matrix over (shared memory with 2 ranks|shared memory, (every message by reference|registered buffers, every message mapped|no message by reference|registered buffers, chunks over 3 paths)|TCP, chunks over 3 paths per peer)$'
compress_matrices='^(ranks:compressed collectives are within|mp:compressed collectives over shared memory)'
box_tsan='^ranks:[A-Za-z]+ with algorithm (reducescatter|allgather|broadcast|reduce|gather|scatter):box$'
# (CMake's regex engine allows 10 groups: the test names added without one.)
tsan_exclude="$not_instrumented|$default_matrix|$second_rank_count|$protocol_variants|$compress_matrices|$host_repeats|$host_tsan|$box_tsan|^fault:a frozen peer|UCX|^unit:ucx:|^ranks:ring and chain split over several channels$"
tsan_datatypes=float

# -g1: line tables only (what the sanitizers' stack traces use), not full debug info: the
# instrumented builds compile and link markedly faster. ASan and the fuzzers build at -O1, as
# the sanitizer documentation and OSS-Fuzz do, with clang (libFuzzer needs it; it also compiles
# the ASan build about 20 % faster than GCC: 35.6 against 45.8 CPU seconds for six of the
# heaviest files, 2026-12-05); TSan with GCC at -O2, since its tests, 5-15x slower than plain
# ones, take longer than its build.
configure_build() {  # dir, optimisation (-O1, -O2), extra cmake arguments...
  local dir=$1 opt=$2
  shift 2
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCHORUS_BUILD_BENCH=OFF \
    -DCHORUS_BUILD_EXAMPLES=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$opt -g1 -DNDEBUG" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$opt -g1 -DNDEBUG" "$@" > "$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; return 1; }
}

run_ctest() {  # dir, exclude, datatypes, [wrapper...]
  local dir=$1 exclude=$2 datatypes=$3
  shift 3
  # ctest drops an -E regex that CMake's engine cannot compile (it allows 10 groups: keep the
  # alternatives above flat) and runs everything: refuse that instead.
  local all kept
  all=$(ctest --test-dir "$dir" -N -L "$core_labels" | sed -n 's/^Total Tests: //p')
  kept=$(ctest --test-dir "$dir" -N -L "$core_labels" -E "$exclude" | sed -n 's/^Total Tests: //p')
  if [ -z "$kept" ] || [ "$kept" = "$all" ]; then
    echo "sanitizers.sh: the exclusion regex for $dir selects $kept of $all tests: it did not compile" >&2
    return 1
  fi
  CHORUS_TEST_DATATYPES=$datatypes "$@" ctest --test-dir "$dir" -j"$jobs" --output-on-failure \
    --no-tests=error -L "$core_labels" -E "$exclude"
}

configure_asan() {  # build-asan: clang, ASan+UBSan, the tests and the fuzz targets
  local cache=build-asan/CMakeCache.txt
  [ -f $cache ] && grep -q '^CHORUS_BUILD_FUZZERS:BOOL=ON' $cache && return 0
  rm -rf build-asan  # an older GCC build-asan: CMake cannot change the compiler in place
  configure_build build-asan -O1 -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCHORUS_WERROR=ON -DCHORUS_BUILD_TESTS=ON -DCHORUS_BUILD_FUZZERS=ON \
    "-DCHORUS_SANITIZE=address;undefined"
}

stage_asan() {
  configure_asan
  cmake --build build-asan -j"$jobs" --target "${core_tests[@]}"
  local asan=detect_leaks=1:check_initialization_order=1:strict_init_order=1
  export ASAN_OPTIONS=$asan:detect_stack_use_after_return=1
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  CHORUS_TEST_NARROW=1 CHORUS_TEST_RANK_COUNTS=1,2,3,4,8 \
    run_ctest build-asan "$asan_exclude" "$asan_datatypes"
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
}

stage_tsan() {
  # Without UCX: libucm's mmap/malloc hooks, installed when libucx loads, crash TSan's
  # interceptors in every test process.
  configure_build build-tsan -O2 -DCHORUS_WERROR=ON -DCHORUS_BUILD_TESTS=ON -DCHORUS_SANITIZE=thread \
    -DCHORUS_ENABLE_UCX=OFF
  cmake --build build-tsan -j"$jobs" --target "${core_tests[@]}"
  # TSan maps its shadow at fixed addresses; with the kernel's address randomisation some
  # mappings land there ("unexpected memory mapping"). setarch -R turns it off for the tests.
  local wrapper=()
  if setarch "$(uname -m)" -R true 2> /dev/null; then wrapper=(setarch "$(uname -m)" -R); fi
  # die_after_fork=0: the fault tests fork their ranks from a process that already runs threads
  # (the bootstrap root); by default TSan refuses to start threads in such a child.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0"
  TSAN_OPTIONS+=":suppressions=$supp/tsan.supp"
  CHORUS_TEST_RANK_COUNTS=2,3,5 run_ctest build-tsan "$tsan_exclude" "$tsan_datatypes" "${wrapper[@]}"
  unset TSAN_OPTIONS
}

stage_fuzz() {
  configure_asan
  cmake --build build-asan -j"$jobs" --target chorus_fuzzers
  export ASAN_OPTIONS="detect_leaks=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # Every committed input (seeds and reproducers of fixed crashes) must pass.
  ctest --test-dir build-asan -j"$jobs" --output-on-failure --no-tests=error -L fuzz
  # The targets run side by side, `jobs` at a time (libFuzzer uses one core each).
  local run=build-asan/fuzz-run  # logs, new inputs, crash artifacts
  local targets=() pids=() failed=()
  for bin in build-asan/tests/fuzz/fuzz_*; do
    local t=${bin##*/fuzz_}
    [ "$t" != seeds ] || continue
    targets+=("$t")
  done
  mkdir -p "$run/artifacts"
  for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.5; done  # exits are reaped below
    # New inputs go to $run/corpus/<target>; the committed corpus is only read.
    mkdir -p "$run/corpus/$t"
    "build-asan/tests/fuzz/fuzz_$t" -max_total_time="$fuzz_seconds" -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$run/artifacts/$t-" "$run/corpus/$t" \
      "tests/fuzz/corpus/$t" > "$run/fuzz_$t.log" 2>&1 &
    pids+=($!)
  done
  local summary="" i
  for i in "${!targets[@]}"; do
    local t=${targets[$i]} log=$run/fuzz_${targets[$i]}.log
    if ! wait "${pids[$i]}"; then
      tail -n 60 "$log"
      echo "sanitizers.sh: fuzz_$t failed; its input is in $run/artifacts/" \
        "(tests/fuzz/README.md: when it finds something)" >&2
      failed+=("$t")
      continue
    fi
    local runs
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    summary+=$(printf '  %-16s %10s executions in %s s\n' "$t" "${runs:-?}" "$fuzz_seconds")$'\n'
  done
  [ ${#failed[@]} -eq 0 ] || return 1
  printf 'fuzzing:\n%s' "$summary"
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
}

for s in "${stages[@]}"; do
  start=$(date +%s)
  echo "==== sanitizers.sh: $s"
  "stage_$s"
  echo "==== sanitizers.sh: $s passed in $(($(date +%s) - start)) s"
  echo "stage time: $s $(($(date +%s) - start)) s"
done
