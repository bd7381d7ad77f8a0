"""Builds the fake NVML library (``fakenvml.c``) with gcc, cached by source hash.

Usable from pytest (``build_fake_nvml(tmp_dir)``) and from scripts
(``python tests/fakenvml/build.py OUT_DIR`` prints the library path). Point the agent at the
result with ``GPUHEALTH_NVML_LIBRARY=<path>`` and at a scenario with ``FAKE_NVML_SCENARIO``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-fvisibility=hidden")


def build_fake_nvml(out_dir: str | os.PathLike[str]) -> Path:
    """Compile fakenvml.c into ``out_dir`` unless a build of the same source is already there."""
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / f"libfakenvml-{digest}.so"
    if lib.exists():
        return lib
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("building the fake NVML library needs gcc (or $CC)")
    # Compile to a temporary name and rename, so concurrent builders never see half a file.
    fd, tmp = tempfile.mkstemp(prefix=".fakenvml-", suffix=".so", dir=out)
    os.close(fd)
    try:
        subprocess.run([cc, *CFLAGS, "-o", tmp, str(SOURCE)], check=True, capture_output=True, text=True)
        os.replace(tmp, lib)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"gcc failed building {SOURCE}:\n{exc.stderr}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def write_scenario(path: str | os.PathLike[str], text: str) -> None:
    """Replace a scenario file atomically so the library never parses a half-written one.

    The rename also gives the file a new inode, so the library notices the change even when
    two writes land within the filesystem's timestamp granularity.
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".scenario-", dir=target.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, target)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR")
    sys.stdout.write(f"{build_fake_nvml(sys.argv[1])}\n")
