#!/bin/bash
# Packs the GPU tests and benchmarks built in build/ for a machine with a
# GPU but without this project's Debian packages: the binaries go to
# DIR/bin, every shared library they need except glibc's, CUDA's driver and
# NCCL goes to DIR/lib (the GPU machine's own libnccl.so.2 is used), and
# DIR/run.sh runs them there. The test binaries hold the absolute paths of
# build/holdfast-run and build/holdfast-dp-trainer-nccl, so run.sh must
# run in a checkout at the same path as this one; it links those two
# names to the bundled binaries.
#
#   scripts/gpu_bundle.sh [DIR]     (a folder in the checkout; default .gpu,
#                                    ignored by git)
#   then, on the GPU machine, in the checkout:  bash DIR/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu}"
if [[ "$dir" == /* || "$dir" == *..* ]]; then
  echo "gpu_bundle: DIR must be a folder inside the checkout (it travels with it)" >&2
  exit 2
fi
bins=(build/test/nccl_test build/test/nccl_job_test build/nccl_bench
      build/holdfast-nccl-probe build/holdfast-run
      build/holdfast-dp-trainer-nccl build/recovery_bench)
for b in "${bins[@]}"; do
  [[ -x "$b" ]] || { echo "gpu_bundle: $b is missing: build with CUDA and NCCL found" >&2; exit 1; }
done
rm -rf "${dir:?}/bin" "${dir:?}/lib"
mkdir -p "$dir/bin" "$dir/lib"
cp "${bins[@]}" "$dir/bin/"
for b in "${bins[@]}"; do ldd "$b" | awk '/=>/ {print $3}'; done | sort -u |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libnccl|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$dir/lib/"; done
cat > "$dir/run.sh" <<EOF
#!/bin/bash
# Runs the bundled GPU tests and benchmarks (see scripts/gpu_bundle.sh).
cd "\$(dirname "\$0")/.." || exit 1
nccl=\$(ldconfig -p | awk '/libnccl.so.2 / {print \$NF; exit}')
LD_LIBRARY_PATH=\$PWD/$dir/lib:\$(dirname "\${nccl:-/usr/lib/x86_64-linux-gnu/libnccl.so.2}")
export LD_LIBRARY_PATH
mkdir -p build
# Links, unless a real build is there.
for b in holdfast-run holdfast-dp-trainer-nccl; do
  [[ -e "build/\$b" && ! -L "build/\$b" ]] || ln -sf "\$PWD/$dir/bin/\$b" "build/\$b"
done
set -x
$dir/bin/holdfast-nccl-probe
$dir/bin/nccl_test "[gpu]"
$dir/bin/nccl_test "[gpu-sticky]"
$dir/bin/nccl_test "[gpu2]"
$dir/bin/nccl_job_test "[gpu]"
$dir/bin/nccl_bench
# Recovery on NCCL with every process on device 0 (see test/nccl_job_test.cc).
printf '#!/bin/sh\\nNCCL_HOSTID=holdfast-\$\$ exec %s "\$@"\\n' "\$PWD/build/holdfast-dp-trainer-nccl" > /tmp/holdfast-trainer-nccl.sh
chmod +x /tmp/holdfast-trainer-nccl.sh
HOLDFAST_BACKEND=nccl HOLDFAST_DEVICE=0 NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \\
  $dir/bin/recovery_bench --ranks 2,4 --state-mb 256 --trainer /tmp/holdfast-trainer-nccl.sh
EOF
chmod +x "$dir/run.sh"
du -sh "$dir"
