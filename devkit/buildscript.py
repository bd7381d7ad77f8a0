"""The one way devkit runs a ``hack/build-*.sh`` script: build once, then answer from its cache.

Every build script prints what it built (a directory) as its last line of stdout and logs to stderr,
which stays on the terminal. A script that fails, or prints nothing, fails the caller with its own
error class (the control plane's, the tools', the real node's), so a tier fails loudly, never skips.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def built(script: Path, error: type[Exception]) -> Path:
    """Run ``script`` (bash) and return the path on its last stdout line; ``error`` if it failed."""
    proc = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, stderr=None, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        name = script.relative_to(REPO) if script.is_relative_to(REPO) else script
        raise error(f"{name} failed with exit code {proc.returncode}")
    return Path(lines[-1])
