#!/usr/bin/env bash
# Installs the Python package the way users do, `pip install .`, into a
# fresh virtual environment made from a clean copy of the tracked tree,
# then runs the Python suite against that install (no PYTHONPATH; its
# bundled launcher and controller) and a 3-rank DDP job through the
# installed `holdfast-run` console script.
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

venv="$work/venv"
rm -rf "$venv"
"${HOLDFAST_PYTHON:-python3}" -m venv "$venv"
start=$(date +%s)
# torch as pinned for the project (pip's cache makes the second install
# of it a local one), then the package.
"$venv/bin/pip" install -q --disable-pip-version-check \
  -r scripts/python-requirements.txt
"$venv/bin/pip" install -q --disable-pip-version-check "$work/src"
echo "test_install.sh: pip install took $(( $(date +%s) - start )) s;" \
  "$(du -sh "$venv" | cut -f1) in $venv"

# The installed package, from anywhere, with no PYTHONPATH.
cd "$work"
env -u PYTHONPATH "$venv/bin/python3" -c \
  'import holdfast, os; print("import holdfast:", os.path.dirname(holdfast.__file__))'
env -u PYTHONPATH HOLDFAST_INSTALLED=1 HOLDFAST_BUILD_DIR="$root/build" \
  "$venv/bin/python3" -m pytest -q -p no:cacheprovider \
  "$root/test/python/test_api.py" "$root/test/python/test_jobs.py" \
  "$root/test/python/test_torch2.py"
# The console script runs the bundled launcher.
out=$(env -u PYTHONPATH PATH="$venv/bin:$PATH" holdfast-run -n 3 --no-disk-tier \
  -- "$venv/bin/python3" "$root/examples/python/ddp_train.py" --steps 10 2>&1)
hashes=$(grep -o "params_sha256=[0-9a-f]*" <<<"$out" | sort -u | wc -l)
ranks=$(grep -c "\] final step=10 world=3" <<<"$out" || true)
if [ "$ranks" -ne 3 ] || [ "$hashes" -ne 1 ]; then
  echo "$out" | tail -40
  echo "test_install.sh: the installed holdfast-run did not finish a 3-rank job" >&2
  exit 1
fi
echo "test_install.sh: the installed package ran a 3-rank DDP job (one hash)"
