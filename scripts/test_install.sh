#!/usr/bin/env bash
# Runs the README's Python section as a new user would, from a clean copy
# of the tracked tree: every command of its sh blocks, as written, with
# HOME at a fresh directory (so ~/venv is a new virtual environment that
# gets only what `pip install .` brings), each of which must exit 0. The
# section's first command, scripts/setup.sh --no-build, is skipped: it
# installs the Debian packages, which scripts/setup.sh installed already.
# Then the Python suite runs against that install (no PYTHONPATH; its
# bundled launcher and controller), with the test requirements added.
# Needs scripts/setup.sh to have run (Debian's packages, and the build's
# test binaries that the tests start: holdfast-controller).
#
#   scripts/test_install.sh [WORKDIR]   (default: a temporary directory,
#                                        removed at the end)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
if [ $# -ge 1 ]; then
  work="$1"
  mkdir -p "$work"
else
  work="$(mktemp -d)"
  # The environment is several GB: gone when the test is.
  trap 'rm -rf "$work"' EXIT
fi

# A clean copy: what `git clone` would give, without the build trees or
# .venv/ of this checkout.
rm -rf "$work/src"
mkdir -p "$work/src"
git ls-files -z | xargs -0 cp --parents -t "$work/src"

# The sh blocks of the README's "## Python" section, one command each
# (backslash-continued lines joined).
mapfile -t commands < <("${HOLDFAST_PYTHON:-python3}" - README.md <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
for block in re.findall(r"```sh\n(.*?)```", section, re.S):
    for command in block.replace("\\\n", " ").splitlines():
        command = command.split("  #")[0].strip()
        if command and not command.startswith("scripts/setup.sh"):
            print(command)
PY
)
[ ${#commands[@]} -ge 2 ] || {
  echo "test_install.sh: found ${#commands[@]} commands in the README's Python section" >&2
  exit 1
}
home="$work/home"
rm -rf "$home"
mkdir -p "$home"
venv="$home/venv"
# `pip install .` compiles what scripts/setup.sh compiled into build/: with
# ccache (which setup.sh configures, paths under the checkout hashed
# relative to the build directory), scikit-build-core's build directory at
# the copy's build/ (the same place relative to the sources), build/'s
# compilers (scikit-build-core would name Python's: g++, not c++, which
# ccache hashes apart) and this user's cache, it reuses those objects. It
# saves about 5 of the command's 8 minutes on 2 cores; the command and
# what it installs are the same.
cache_env=()
cache="${BUILD_DIR:-build}/CMakeCache.txt"
if command -v ccache >/dev/null && grep -q "^CMAKE_CXX_COMPILER_LAUNCHER:.*ccache" "$cache" 2>/dev/null; then
  launcher="env;CCACHE_BASEDIR=$work/src;ccache"
  cache_env=(SKBUILD_BUILD_DIR=build CCACHE_DIR="$(ccache -k cache_dir)"
    CC="$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$cache")"
    CXX="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache")"
    CMAKE_ARGS="-DCMAKE_C_COMPILER_LAUNCHER=$launcher -DCMAKE_CXX_COMPILER_LAUNCHER=$launcher")
fi
start=$(date +%s)
for command in "${commands[@]}"; do
  echo "test_install.sh: \$ $command"
  set +e
  out=$(cd "$work/src" && env -u PYTHONPATH "${cache_env[@]}" HOME="$home" \
    PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}" \
    PATH="$(dirname "$(command -v "${HOLDFAST_PYTHON:-python3}")"):$PATH" \
    bash -c "$command" 2>&1)
  rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    echo "$out" | tail -40
    echo "test_install.sh: the README's command exited $rc: $command" >&2
    exit 1
  fi
  echo "$out" | grep -E "^exit code:|final step=|ETTR" | head -8 || true
done
echo "test_install.sh: the README's Python commands passed in" \
  "$(( $(date +%s) - start )) s; $(du -sh "$venv" | cut -f1) in $venv"

# The installed package, from anywhere, with no PYTHONPATH, and the suite
# against it (pytest and the test-only packages added now).
"$venv/bin/pip" install -q --disable-pip-version-check \
  -r scripts/python-requirements.txt
cd "$work"
env -u PYTHONPATH "$venv/bin/python3" -c \
  'import holdfast, os; print("import holdfast:", os.path.dirname(holdfast.__file__))'
# The suite against the install: the API, every torch.distributed call,
# and of the job tests (which ctest runs whole against the build tree,
# where they test the runtime) those that test what the install brings:
# the launcher and controller it bundles, its exit codes, a DDP job
# through a kill from inside and from outside, an FSDP2 job through a kill
# (fully_shard on the installed module's group), and the libtorch trainer
# against the installed torch. All of test_jobs and test_torch2 again
# (14 minutes on the 2-core VM, 2026-11-29) tested the runtime a second
# time, not the install.
jobs="$root/test/python/test_jobs.py"
torch2="$root/test/python/test_torch2.py"
env -u PYTHONPATH HOLDFAST_INSTALLED=1 HOLDFAST_BUILD_DIR="$root/build" \
  "$venv/bin/python3" -m pytest -q -p no:cacheprovider \
  "$root/test/python/test_api.py" "$root/test/python/test_conformance.py" \
  "$torch2::test_fsdp2_trains_on_the_registered_partitions_through_a_kill" \
  "$jobs::test_collectives_on_torch_tensors" \
  "$jobs::test_ddp_survives_a_fault_with_the_fault_free_hash[3-kill:slot=1:step=5]" \
  "$jobs::test_ddp_survives_a_signal_from_outside_with_the_fault_free_hash" \
  "$jobs::test_libtorch_trainer_survives_a_kill_with_the_fault_free_hash" \
  "$jobs::test_a_worker_that_exits_non_zero_after_training_fails_the_launch" \
  "$jobs::test_replicas_that_differ_at_the_end_fail_the_launch" \
  "$jobs::test_a_standby_that_takes_a_slot_and_fails_fails_the_launch" \
  "$jobs::test_a_clean_job_exits_0_with_no_problems"
