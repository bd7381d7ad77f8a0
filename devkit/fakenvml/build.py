"""Builds the fake NVML library (``fakenvml.c``) with gcc, cached by source hash.

Usable from pytest (``build_fake_nvml(tmp_dir)``) and from scripts
(``python devkit/fakenvml/build.py OUT_DIR`` prints the library path). Point the agent at the
result with ``GPUHEALTH_NVML_LIBRARY=<path>`` and at a scenario with ``FAKE_NVML_SCENARIO``.

When NVIDIA's ``nvml.h`` is installed (the ``nvidia-nvml-dev`` wheel of the test extra puts it
under ``site-packages/nvidia/cu*/include``; ``$FAKE_NVML_INCLUDE`` names another directory) the
fake is compiled against it, so its types, layouts and every exported prototype are NVIDIA's and
a drift is a compile error. Without it the fake uses its own checked copy (``fakenvml_types.h``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("fakenvml.c")
OWN_TYPES = Path(__file__).with_name("fakenvml_types.h")
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-fvisibility=hidden")
# With NVIDIA's header: declare the legacy unversioned names too (the fake exports both), and make
# an exported function without a prototype of NVIDIA's an error.
HEADER_FLAGS = ("-DFAKENVML_WITH_NVML_H", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", "-Wmissing-prototypes")
ENV_INCLUDE = "FAKE_NVML_INCLUDE"


def find_nvml_include() -> Path | None:
    """The directory holding NVIDIA's ``nvml.h``: ``$FAKE_NVML_INCLUDE``, else the nvidia-nvml-dev wheel's."""
    override = os.environ.get(ENV_INCLUDE)
    if override:
        return Path(override) if (Path(override) / "nvml.h").is_file() else None
    roots = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages(), *sys.path]
    for root in dict.fromkeys(r for r in roots if r):
        # nvidia-nvml-dev 13.x: nvidia/cu13/include/nvml.h (12.x wheels: nvidia/cu12/include or nvidia/nvml/include).
        for header in sorted(Path(root).glob("nvidia/*/include/nvml.h"), reverse=True):
            return header.parent
    return None


def compile_flags(include: Path | None) -> list[str]:
    """gcc flags for the fake: NVIDIA's header when ``include`` has it, else the fake's own types."""
    return [*CFLAGS, *((*HEADER_FLAGS, f"-I{include}") if include is not None else ())]


def build_fake_nvml(out_dir: str | os.PathLike[str]) -> Path:
    """Compile fakenvml.c into ``out_dir`` unless a build of the same source is already there."""
    include = find_nvml_include()
    flags = compile_flags(include)
    header = (include / "nvml.h").read_bytes() if include is not None else b""
    source = SOURCE.read_bytes() + OWN_TYPES.read_bytes() + header
    digest = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
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
        subprocess.run([cc, *flags, "-o", tmp, str(SOURCE)], check=True, capture_output=True, text=True)
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
