#!/bin/bash
# Packs what the GPU checks need from build/ for a machine with a GPU but
# without this project's Debian packages (scripts/gpu_check.sh runs them
# there), into DIR (default .gpu, ignored by git):
#   DIR/bin     the GPU tests, benchmarks, holdfast-run and the NCCL trainer,
#               their rpath set to DIR/lib (patchelf), so nothing needs
#               LD_LIBRARY_PATH;
#   DIR/lib     every shared library they and the Python module need, except
#               glibc's, libstdc++ and libgcc_s (the GPU machine's are newer),
#               CUDA's driver and runtime, and NCCL: there, those are the
#               machine's and torch's (one NCCL per process);
#   DIR/static  the holdfast archives the Python module links, and
#   DIR/include Abseil's headers and holdfast's version.h: gpu_check.sh
#               compiles src/python/module.cc there, against that machine's
#               Python, pybind11 and torch's NCCL.
# The test binaries hold the absolute paths of build/holdfast-run and
# build/holdfast-dp-trainer-nccl, so the checkout must be at the same path
# there; gpu_check.sh links those names to the bundled binaries.
#
#   scripts/gpu_bundle.sh [DIR]     (a folder in the checkout)
#   then, on the GPU machine, in the checkout:  bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu}"
if [[ "$dir" == /* || "$dir" == *..* ]]; then
  echo "gpu_bundle: DIR must be a folder inside the checkout (it travels with it)" >&2
  exit 2
fi
command -v patchelf >/dev/null || {
  echo "gpu_bundle: patchelf is missing (scripts/setup.sh installs it)" >&2; exit 1; }
bins=(build/test/nccl_test build/test/nccl_job_test build/nccl_bench
      build/holdfast-nccl-probe build/holdfast-run
      build/holdfast-dp-trainer-nccl build/recovery_bench)
module=$(ls build/python/holdfast/_C*.so 2>/dev/null | head -1)
archives=(build/libholdfast_runtime.a build/libholdfast_member.a
          build/libholdfast_wire.a build/libholdfast_checkpoint.a
          build/libholdfast_nccl.a build/libholdfast.a)
for b in "${bins[@]}" "$module" "${archives[@]}"; do
  [[ -e "$b" ]] || { echo "gpu_bundle: ${b:-the Python module} is missing: build with CUDA and NCCL found" >&2; exit 1; }
done
[ "$(nm -C "$module" | grep -c "holdfast::nccl::LoadedVersion")" -gt 0 ] || {
  echo "gpu_bundle: $module was built without the NCCL backend" >&2; exit 1; }
rm -rf "${dir:?}/bin" "${dir:?}/lib" "${dir:?}/static" "${dir:?}/include" \
       "${dir:?}/build"
mkdir -p "$dir/bin" "$dir/lib" "$dir/static" "$dir/include/holdfast"
cp "${bins[@]}" "$dir/bin/"
cp "${archives[@]}" "$dir/static/"
cp -r /usr/include/absl "$dir/include/"
cp build/include/holdfast/version.h "$dir/include/holdfast/"
for b in "${bins[@]}" "$module"; do ldd "$b" | awk '/=>/ {print $3}'; done | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libnccl|libcuda|libcudart)\.so' |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done
# DT_RPATH (not RUNPATH): it serves the libraries' own dependencies too.
for b in "$dir"/bin/*; do
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$b"
done
du -sh "$dir"
