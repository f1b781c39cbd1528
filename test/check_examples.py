"""The launch examples of docs/multi-node.md, checked as far as can be
done here (CTest: "examples: ...", label check).

- examples/kubernetes/holdfast-job.yaml validates, strictly, against the
  Kubernetes API's schema (kubernetes-validate, from PyPI), and the
  command its pods run is one holdfast-run accepts: run here with the
  values Kubernetes would fill in, it gets as far as looking for the
  controller at pod 0's name.
- examples/slurm/holdfast.sbatch is valid bash; test/network/
  test_multinode.py runs its srun line on test hosts.

    python test/check_examples.py BUILD_DIR
"""

import os
import pathlib
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
K8S_VERSION = "1.32.0"


def check_manifest(build):
    manifest = ROOT / "examples/kubernetes/holdfast-job.yaml"
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate",
                        "--strict", "-k", K8S_VERSION, str(manifest)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = list(yaml.safe_load_all(manifest.read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    service = next(d for d in docs if d["kind"] == "Service")
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    cmd = container["command"]
    assert cmd[0] == "holdfast-run", cmd
    values = {"JOB_COMPLETION_INDEX": "1", **env}
    args = []
    for a in cmd[1:cmd.index("--")]:
        for k, v in values.items():
            a = a.replace(f"$({k})", v)
        args.append(a)
    endpoint = next(a.split("=", 1)[1] for a in args
                    if a.startswith("--rdzv-endpoint="))
    assert endpoint.startswith(f"{job['metadata']['name']}-0.") and \
        endpoint.split(".")[1].startswith(service["metadata"]["name"]), endpoint
    r = subprocess.run(
        [str(build / "holdfast-run"), *args, "--join-timeout-s", "1", "--",
         str(build / "holdfast-dp-trainer")],
        capture_output=True, text=True, timeout=60,
        env=dict(os.environ, HOLDFAST_HOST="holdfast-1"))
    want = f"no controller answered at {endpoint}"
    assert r.returncode == 1 and want in r.stderr, (r.returncode, r.stderr)
    print(f"examples: {manifest.name} validates against Kubernetes "
          f"{K8S_VERSION}; its command parses and looks for {endpoint}")


def check_slurm():
    script = ROOT / "examples/slurm/holdfast.sbatch"
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    print(f"examples: {script.name} is valid bash")


if __name__ == "__main__":
    build = pathlib.Path(sys.argv[1]).resolve()
    check_manifest(build)
    check_slurm()
