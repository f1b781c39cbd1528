#!/bin/bash
# Every GPU check, on a machine with a GPU, from a checkout with the bundle
# of scripts/gpu_bundle.sh (.gpu/) carried over. Writes one JSON summary
# (SUMMARY, default $OUT/gpu_summary.json or .gpu/out/gpu_summary.json)
# and the logs beside it. Exit code 0 when every check passed.
#
#   bash scripts/gpu_check.sh [python] [cpp] [bench]   (default: all three,
#                                                       in the order given)
#
# PYTEST_TARGETS: the tests to run (default test/python/test_gpu.py);
# HOLDFAST_TEST_JOB_TIMEOUT: seconds a test's job may take (default 90);
# GDB_TARGET: a test to rerun under cuda-gdb when the Python tests fail;
# REPEAT_FROZEN: runs of nccl_job_test's frozen-rank case after the rest
# (default 0); BENCH_STOPS: the HOLDFAST_NCCL_STOP of each recovery_bench
# run, each optionally with /P for HOLDFAST_NCCL_PRECONNECT=P and then /O
# for HOLDFAST_OVERLAP_INIT (1 on, 0 off) (default
# "revoke revoke/0 revoke/1/0 revoke": an A/B of the preconnect and one of
# the NCCL init overlapped with the restore); BENCH_KILL_STEP: its kill's step
# (default 100: about 2 s in, once the standby's NCCL is warm; at step 5
# the rebuild waited for the warm-up); HOLDFAST_NCCL_STOP: how every test
# job's NCCL communicators stop (default abort); BUDGET: seconds for the
# whole script (see check).
#
# python: builds holdfast._C for this machine's Python against its torch's
#         NCCL, then test/python/test_gpu.py (collectives on CUDA tensors,
#         DDP and FSDP2 on CUDA with a SIGKILL and a SIGSTOP, a shrink);
# cpp:    nccl_test [gpu] and [gpu-sticky], nccl_job_test [gpu];
# bench:  nccl_bench; recovery_bench (4 ranks x 256 MiB, NCCL, with its
#         restart baseline) as BENCH_STOPS says (an A/B in one run); and one such recovery with
#         info logs and NCCL's init timings (recovery-trace.log), for
#         where the time goes.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out="${OUT:-$root/.gpu/out}"
mkdir -p "$out"
summary="${SUMMARY:-$out/gpu_summary.json}"
py="${PYTHON:-python3}"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(python cpp bench)
[ -x .gpu/bin/holdfast-run ] || { echo "gpu_check: no bundle: run scripts/gpu_bundle.sh first" >&2; exit 2; }

results=()
# BUDGET: seconds the whole script may take (default 0: no bound). Each
# check's limit is cut to what is left, less 20 s for the summary and the
# logs' archive; a check with under 20 s left is skipped (rc 125), so the
# script always ends with its summary inside a device call's limit.
budget="${BUDGET:-0}"
# check NAME SECONDS CMD...: runs CMD with a time limit, logs to NAME.log.
check() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  if [ "$budget" -gt 0 ]; then
    local left=$((budget - SECONDS - 20))
    if [ "$left" -lt 20 ]; then
      echo "=== $name: skipped, out of time (BUDGET=$budget)" >&2
      results+=("{\"check\": \"$name\", \"rc\": 125, \"seconds\": 0, \"skipped\": true}")
      return 125
    fi
    [ "$limit" -gt "$left" ] && limit=$left
  fi
  echo "=== $name" >&2
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  tail -n 25 "$out/$name.log" >&2
  results+=("{\"check\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}")
  echo "=== $name: rc=$rc in $((SECONDS - t0)) s" >&2
  return $rc
}

# torch's NCCL and CUDA runtime: what the Python module and the C++
# binaries load (one NCCL per process, the same in both).
nccl_lib=$($py -c "import nvidia.nccl as n; print(list(n.__path__)[0] + '/lib')")
cudart=$($py -c "import glob, os, nvidia; print(sorted(p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, '*', 'lib', 'libcudart.so.*')))[0])")
export LD_LIBRARY_PATH_CPP="$nccl_lib:$(dirname "$cudart")"
if [ "${1:-}" = "--build-module" ]; then
  # The Python module for this machine's Python and torch's NCCL (the rest
  # of holdfast comes prebuilt in .gpu/static and .gpu/lib).
  pyinc=$($py -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  pybind=$($py -c "import pybind11; print(pybind11.get_include())" 2>/dev/null || echo /usr/include)
  ext=$($py -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  cp python/holdfast/*.py .gpu/build/python/holdfast/
  ${CXX:-g++} -O2 -std=c++17 -shared -fPIC -fvisibility=hidden \
    -DHOLDFAST_PYTHON_NCCL -I. -Iinclude -I.gpu/include -I"$pyinc" -I"$pybind" \
    src/python/module.cc -o ".gpu/build/python/holdfast/_C$ext" \
    -Wl,--start-group .gpu/static/*.a -Wl,--end-group \
    -Wl,--as-needed .gpu/lib/*.so* "$nccl_lib/libnccl.so.2" "$cudart" \
    -Wl,--version-script=src/python/module.map -Wl,--exclude-libs,ALL \
    -Wl,--disable-new-dtags,-rpath,"$root/.gpu/lib" || exit 1
  # What this toolchain put into the module (see src/python/module.map).
  ${CXX:-g++} --version | head -1
  echo "libstdc++: $(${CXX:-g++} -print-file-name=libstdc++.so)"
  head -c 300 "$(${CXX:-g++} -print-file-name=libstdc++.so)" | tr -cd '[:print:]\n' | head -3
  echo "exported: $(nm -D --defined-only .gpu/build/python/holdfast/_C$ext | wc -l) symbols"
  echo "libstdc++ code inside: $(nm .gpu/build/python/holdfast/_C$ext | grep -c 'execute_native_thread_routine\|_ZNSo9_M_insertIlEERSoT_')"
  exit 0
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $py -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
} > "$out/machine.txt" 2>&1
echo "checkout: $root" >> "$out/machine.txt"
cat "$out/machine.txt" >&2

mkdir -p build .gpu/build/python/holdfast
for b in holdfast-run holdfast-dp-trainer-nccl; do
  [[ -e "build/$b" && ! -L "build/$b" ]] || ln -sf "$root/.gpu/bin/$b" "build/$b"
  ln -sf "$root/.gpu/bin/$b" ".gpu/build/$b"
done


failed=0
export HOLDFAST_TEST_JOB_LOG_DIR="$out/jobs"
part_python() {
  check python-module 120 bash "$0" --build-module || failed=1
  HOLDFAST_BUILD_DIR="$root/.gpu/build" PYTHONPATH="$root/.gpu/build/python" \
    HOLDFAST_TEST_JOB_TIMEOUT="${HOLDFAST_TEST_JOB_TIMEOUT:-90}" \
    PYTHONUNBUFFERED=1 check python-gpu "${PYTHON_LIMIT:-270}" \
    $py -m pytest -q -rA --maxfail=2 -p no:cacheprovider \
    --junitxml="$out/pytest.xml" ${PYTEST_TARGETS:-test/python/test_gpu.py} \
    || { failed=1
         # The first failing DDP case again, each rank under cuda-gdb
         # (HOLDFAST_RANK_GDB, test/python/gpu_rank.sh): every thread's
         # backtrace if a rank crashes.
         [ -n "${GDB_TARGET:-}" ] &&
           HOLDFAST_RANK_GDB=1 HOLDFAST_BUILD_DIR="$root/.gpu/build" \
           PYTHONPATH="$root/.gpu/build/python" HOLDFAST_TEST_JOB_TIMEOUT=120 \
           PYTHONUNBUFFERED=1 check python-gdb 150 \
           $py -m pytest -q -rA -s -x -p no:cacheprovider "$GDB_TARGET"; }
}
part_cpp() {
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH_CPP" check nccl-test 60 .gpu/bin/nccl_test "[gpu]" || failed=1
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH_CPP" check nccl-sticky 30 .gpu/bin/nccl_test "[gpu-sticky]" || failed=1
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH_CPP" check nccl-job-test 300 .gpu/bin/nccl_job_test "[gpu]" || failed=1
  # The frozen-rank case again, REPEAT_FROZEN times (default 0), with
  # HOLDFAST_NCCL_STOP as set: it once ended with another hash on the
  # standby under revoke (docs/gpu.md).
  local i
  for ((i = 1; i <= ${REPEAT_FROZEN:-0}; i++)); do
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH_CPP" check "nccl-frozen-$i" 90 \
      .gpu/bin/nccl_job_test "nccl job: a frozen rank 0*" || failed=1
  done
}
part_bench() {
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH_CPP" check nccl-bench 60 .gpu/bin/nccl_bench --json || failed=1
  printf '#!/bin/sh\nNCCL_HOSTID=holdfast-$$ exec %s "$@"\n' "$root/build/holdfast-dp-trainer-nccl" > /tmp/holdfast-trainer-nccl.sh
  chmod +x /tmp/holdfast-trainer-nccl.sh
  local run stop pre overlap i=0
  for run in ${BENCH_STOPS:-revoke revoke/0 revoke/1/0 revoke}; do
    i=$((i + 1))
    IFS=/ read -r stop pre overlap <<< "$run"
    pre=${pre:-1}
    overlap=${overlap:-1}
    local overlap_env=on
    [ "$overlap" = 0 ] && overlap_env=off
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH_CPP" HOLDFAST_BACKEND=nccl HOLDFAST_DEVICE=0 \
      HOLDFAST_NCCL_STOP=$stop HOLDFAST_NCCL_PRECONNECT=$pre \
      HOLDFAST_OVERLAP_INIT=$overlap_env \
      NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
      check "recovery-bench-$i-$stop-pre$pre-overlap$overlap" 120 \
      .gpu/bin/recovery_bench --ranks 4 --state-mb 256 --json \
      --kill-step "${BENCH_KILL_STEP:-100}" \
      --trainer /tmp/holdfast-trainer-nccl.sh || failed=1
  done
  # One such recovery with every member's info log and NCCL's init timings
  # (HOLDFAST_NCCL_STOP as set).
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH_CPP" HOLDFAST_BACKEND=nccl HOLDFAST_DEVICE=0 \
    NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=INFO \
    NCCL_DEBUG_SUBSYS=INIT HOLDFAST_LOG_LEVEL=info \
    check recovery-trace 60 .gpu/bin/holdfast-run -n 4 --standby 1 \
    --no-disk-tier --log-dir "$out/recovery-trace" \
    --inject "kill:slot=1:step=${BENCH_KILL_STEP:-100}:committed=1" \
    -- /tmp/holdfast-trainer-nccl.sh --state-mb 256 --step-ms 20 \
    --steps $((${BENCH_KILL_STEP:-100} + 3)) || failed=1
}
for part in "${parts[@]}"; do
  case "$part" in
    python|cpp|bench) "part_$part" ;;
    *) echo "gpu_check: unknown part '$part' (python, cpp, bench)" >&2; failed=1 ;;
  esac
done

{
  echo "{\"date\": \"$(date -u +%FT%TZ)\","
  echo " \"machine\": $($py -c 'import json,sys; print(json.dumps(open(sys.argv[1]).read().strip()))' "$out/machine.txt"),"
  echo " \"checks\": [$(IFS=,; echo "${results[*]}")],"
  echo " \"passed\": $([ $failed -eq 0 ] && echo true || echo false)}"
} > "$summary"
cat "$summary"
# The logs as one archive beside the summary (a device call brings back
# few files).
# tar leaves out what is missing (no pytest.xml without the python part).
(cd "$out" && tar czf logs.tar.gz $(ls -d ./*.log ./*.xml machine.txt jobs recovery-trace 2>/dev/null) &&
  rm -rf ./*.log ./*.xml jobs recovery-trace)
exit $failed
