#!/usr/bin/env bash
# The CUDA kernels' machine code (SASS), read without a GPU: for each of sm_80
# and sm_90 that the build compiled,
#   - our tensor-core attention kernels (attention_tc.cu) issue bf16 matrix
#     instructions (HMMA.*.BF16, or Hopper's HGMMA);
#   - the INT8 linear passes (int8_linear.cu) that keep a thread's values in
#     register arrays (the epilogue, the bf16 quantisation) touch no local
#     memory (LDL/STL: an array spilled or indexed at run time; kernels
#     without such arrays may still save registers around the IEEE division's
#     slow-path call, as the tile dequantisation does on sm_80);
#   - the bf16 quantisation has no FP64 arithmetic (DMUL/DFMA/DADD: the f32
#     input's exact path, 1/64 rate on consumer GPUs) and reads x 16 bytes at
#     a time (LDG.E.128);
#   - the bf16 tile dequantisation reads 16 codes and writes 16 values with
#     16-byte accesses (nvcc has split such vector accesses into scalar ones
#     before, silently).
# The int8 matrix products run in cuBLASLt (its IMMA/IGMMA kernels), not in
# our objects, except CUTLASS's Hopper int8 GEMM (kernels/cutlass/, where the
# build has CUTLASS's headers): its object must hold sm_90a code alone, with
# Hopper's int8 warpgroup matrix instructions (IGMMA) and no 16-bit ones.
# Usage: test_sass.sh CUOBJDUMP NVDISASM OBJECT... (the kernels_cuda objects,
# then kernels_cutlass's if built; an argument may hold several, separated by
# ';', as CMake passes a list)
set -uo pipefail
cuobjdump=$1 nvdisasm=$2
shift 2
IFS=';' read -r -a objects <<<"$(IFS=';'; echo "$*")"
set -- "${objects[@]}"
if [ ! -x "$cuobjdump" ] || [ ! -x "$nvdisasm" ]; then
  echo "skipped: no cuobjdump/nvdisasm ($cuobjdump, $nvdisasm): scripts/deps fetches them"
  exit 77
fi
export PATH="$(dirname "$nvdisasm"):$PATH"
object() { for o in "$@"; do case $o in */$name) echo "$o"; return;; esac; done; }
passed=0 failed=0
check() {  # check WHAT CONDITION...: one result line
  local what=$1
  shift
  if "$@"; then passed=$((passed + 1)); else echo "FAILED: $what"; failed=$((failed + 1)); fi
}
# The SASS of the functions whose mangled names match $2 in object $1 for arch $3.
sass_of() {
  "$cuobjdump" -sass -arch "$3" "$1" 2>/dev/null |
    awk -v f="$2" '/Function : /{p = ($0 ~ f); next} p'
}
has() { grep -qE "$1" <<<"$2"; }
lacks() { ! grep -qE "$1" <<<"$2"; }

name=attention_tc.cu.o; attention=$(object "$@")
name=int8_linear.cu.o; int8=$(object "$@")
[ -n "$attention" ] && [ -n "$int8" ] || { echo "FAILED: attention_tc.cu.o or int8_linear.cu.o not given"; exit 1; }
archs=$("$cuobjdump" -lelf "$int8" | grep -oE 'sm_(80|90)\b' | sort -u)
[ -n "$archs" ] || { echo "FAILED: $int8 holds neither sm_80 nor sm_90 code"; exit 1; }
for arch in $archs; do
  for kernel in attention_forward_tc_kernel attention_backward_tc_kernel; do
    code=$(sass_of "$attention" "$kernel" "$arch")
    check "$arch $kernel: some code" has . "$code"
    check "$arch $kernel: bf16 tensor-core instructions" has '\b(HMMA\.[0-9A-Z.]*BF16|HGMMA)' "$code"
  done
  for kernel in forward_epilogue_kernel 'quantize_inliers_kernelILb1'; do
    code=$(sass_of "$int8" "$kernel" "$arch")
    check "$arch $kernel: some code" has . "$code"
    check "$arch $kernel: no local memory" lacks '\b(LDL|STL)\b' "$code"
  done
  code=$(sass_of "$int8" 'quantize_inliers_kernelILb1' "$arch")
  check "$arch bf16 quantisation: no FP64" lacks '\b(DMUL|DFMA|DADD)\b' "$code"
  check "$arch bf16 quantisation: 16-byte loads" has '\bLDG\.E\.128\b' "$code"
  code=$(sass_of "$int8" 'dequantize_tile_kernelILb1' "$arch")
  check "$arch bf16 tile dequantisation: 16-byte code loads" has '\bLDG\.E\.128\b' "$code"
  check "$arch bf16 tile dequantisation: 16-byte stores" has '\bSTG\.E\.128\b' "$code"
done
name=int8_scaled_gemm_sm90.cu.o; cutlass=$(object "$@")
if [ -n "$cutlass" ]; then
  check "CUTLASS int8 GEMM: sm_90a code only" test "$("$cuobjdump" -lelf "$cutlass" | grep -oE 'sm_[0-9]+a?' | sort -u)" = sm_90a
  code=$(sass_of "$cutlass" GemmUniversal sm_90a)
  check "sm_90a CUTLASS int8 GEMM: int8 warpgroup matrix instructions" has '\bIGMMA\.' "$code"
  check "sm_90a CUTLASS int8 GEMM: no 16-bit matrix instructions" lacks '\b(HGMMA|HMMA)\b' "$code"
  archs="$archs sm_90a"
fi
echo "checked $(echo $archs): $passed passed, $failed failed"
[ "$failed" -eq 0 ]
