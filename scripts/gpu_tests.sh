#!/usr/bin/env bash
# Runs every GoogleTest binary under BUILD_DIR/bin (test_*) the way ctest would (working directory
# BUILD_DIR), brief output, and prints one line per binary plus totals. This is the check to run
# on the GPU machine, where the CUDA tests actually execute (in CI they skip).
#
#   scripts/gpu_tests.sh BUILD_DIR [GTEST_FILTER]
#
# Full logs go to $LOG_DIR (default BUILD_DIR/gpu-test-logs); failures are echoed below their
# binary's line. Exit status: 0 when nothing failed or crashed, 1 otherwise.
set -u
BUILD=${1:-build}
FILTER=${2:-*}
BIN="$BUILD/bin"
if [ ! -d "$BIN" ]; then
  echo "gpu_tests.sh: $BIN does not exist (build first)" >&2
  exit 2
fi
BUILD=$(cd "$BUILD" && pwd)
BIN="$BUILD/bin"
LOG_DIR=${LOG_DIR:-$BUILD/gpu-test-logs}
mkdir -p "$LOG_DIR"

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
else
  echo "GPU: nvidia-smi not found (CUDA tests will skip)"
fi

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

count() {  # count PATTERN FILE: the number in the first gtest summary line matching PATTERN
  local n
  n=$(grep -E "$1" "$2" | head -1 | grep -oE '[0-9]+' | head -1)
  echo "${n:-0}"
}

tot_pass=0 tot_fail=0 tot_skip=0 bad=0 nbin=0
t_all=$(date +%s.%N)
printf '%-26s %-10s %6s %6s %6s %9s\n' binary status pass fail skip seconds
for t in "$BIN"/test_*; do
  [ -f "$t" ] && [ -x "$t" ] || continue
  name=$(basename "$t")
  # BINARIES="test_conv test_model_golden" runs only those
  if [ -n "${BINARIES:-}" ] && [[ " $BINARIES " != *" $name "* ]]; then continue; fi
  log="$LOG_DIR/$name.log"
  t0=$(date +%s.%N)
  (cd "$BUILD" && GTEST_BRIEF=1 "$t" --gtest_brief=1 --gtest_filter="$FILTER") >"$log" 2>&1
  rc=$?
  secs=$(elapsed "$t0")
  pass=$(count '^\[  PASSED  \] [0-9]+ test' "$log")
  fail=$(count '^\[  FAILED  \] [0-9]+ test' "$log")
  skip=$(count '^\[  SKIPPED \] [0-9]+ test' "$log")
  status=ok
  if [ "$fail" -gt 0 ]; then
    status=FAILED
  elif [ "$rc" -ne 0 ]; then
    status="CRASH($rc)"
  elif [ "$pass" -eq 0 ] && [ "$skip" -gt 0 ]; then
    status=skipped
  fi
  printf '%-26s %-10s %6d %6d %6d %9s\n' "$name" "$status" "$pass" "$fail" "$skip" "$secs"
  if [ "$status" = FAILED ] || [ "${status#CRASH}" != "$status" ]; then
    bad=1
    # brief mode logs only failures: show them (bounded), indented
    grep -vE '^\[==========\]|^\[  PASSED  \]|^\[  SKIPPED \]|^$' "$log" | head -60 | sed 's/^/    /'
  fi
  tot_pass=$((tot_pass + pass)) tot_fail=$((tot_fail + fail)) tot_skip=$((tot_skip + skip))
  nbin=$((nbin + 1))
done
secs=$(elapsed "$t_all")
printf '%-26s %-10s %6d %6d %6d %9s\n' "TOTAL ($nbin binaries)" "$([ $bad = 0 ] && echo ok || echo FAILED)" \
  "$tot_pass" "$tot_fail" "$tot_skip" "$secs"
echo "logs: $LOG_DIR"
exit $bad
