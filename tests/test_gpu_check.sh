#!/usr/bin/env bash
# scripts/gpu_check's gate, on a machine without a GPU: stand-ins for
# nvidia-smi, ctest, compute-sanitizer, python3 and the bench_gpu binary make
# it run every part. A failing `ctest -L gpu` must fail gpu_check (exit
# non-zero, the failure in the report); the same run with a passing ctest
# must pass, so the first result is the ctest's and not something else's.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/build/tests/gpu"
stub() {  # stub NAME BODY: an executable NAME in $work/bin running BODY
  printf '#!/usr/bin/env bash\n%s\n' "$2" > "$work/bin/$1"
  chmod +x "$work/bin/$1"
}
stub nvidia-smi 'echo "GPU 0: Stand-in GPU (UUID: GPU-0)"'
stub ctest 'echo "ctest $*"; exit "${FAKE_CTEST_STATUS:-0}"'
stub compute-sanitizer 'echo "compute-sanitizer $*"'
stub python3 'exit 1'  # no torch: bench_gpu measures no peer
printf '#!/usr/bin/env bash\necho "bench_gpu $*"\n' > "$work/build/tests/gpu/bench_gpu"
chmod +x "$work/build/tests/gpu/bench_gpu"

status=0
run_gate() {  # run_gate CTEST_STATUS: gpu_check's exit status
  PATH="$work/bin:$PATH" BUILD_DIR="$work/build" FAKE_CTEST_STATUS=$1 \
    "$root/scripts/gpu_check" --no-build "$work/report_$1.txt" >/dev/null 2>&1
}
run_gate 8
failing=$?
if [ "$failing" -eq 0 ]; then
  echo "FAILED: gpu_check exited 0 although ctest -L gpu failed"; status=1
fi
grep -q "FAILED (8): ctest" "$work/report_8.txt" || { echo "FAILED: the report does not name the ctest failure"; status=1; }
run_gate 0
passing=$?
if [ "$passing" -ne 0 ]; then
  echo "FAILED: gpu_check exited $passing with every stand-in passing:"; cat "$work/report_0.txt"; status=1
fi
echo "gpu_check with a failing ctest: exit $failing; with a passing one: exit $passing"
if [ "$status" -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit "$status"
