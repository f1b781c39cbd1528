"""Console scripts of an installed package: the bundled binaries.

`pip install .` puts holdfast-run, holdfast-controller, holdfast-agent and
holdfast (the CLI) into holdfast/bin/; these entry points run them with the
same arguments, replacing the Python process."""

import os
import sys


def _exec(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)
    if not os.access(path, os.X_OK):
        sys.exit(
            f"{name}: {path} is missing; this holdfast package was not "
            f"installed with pip (in a build tree, run build/{name})"
        )
    os.execv(path, [name] + sys.argv[1:])


def run():
    _exec("holdfast-run")


def controller():
    _exec("holdfast-controller")


def agent():
    _exec("holdfast-agent")


def cli():
    _exec("holdfast")
