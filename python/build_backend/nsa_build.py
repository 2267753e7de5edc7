"""PEP 517 build backend of the Python package: `pip install .` builds nsa
with the project's CMake (scripts/setup.sh: Debian's MLIR 22, CMake and
Ninja, incremental in build/ or $NSA_BUILD_DIR) and packs the package with
the libraries it loads into a wheel:

    nsa/                      python/nsa (as the build lays it out)
    nsa/lib/                  libNSA-C, libnsa_error, libnsa_reference and,
                              with a CUDA toolkit, libnsa_runtime and
                              libnsa_layers (they find each other by
                              $ORIGIN; MLIR by its Debian path)

The libraries do not depend on the Python ABI (the package loads them with
ctypes), so the wheel is py3-none-<platform>. An existing build folder is
built incrementally, never reconfigured: pip install . over the folder the
README's commands made compiles nothing again.
"""

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import sysconfig
import zipfile

NAME = "nsa"
VERSION = "0.1.0"
LIBRARIES = ["libNSA-C.so", "libnsa_error.so", "libnsa_reference.so",
             "libnsa_runtime.so", "libnsa_layers.so"]
REQUIRED = {"libNSA-C.so", "libnsa_error.so", "libnsa_reference.so"}
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _metadata():
    readme = open(os.path.join(SOURCE, "README.md"), encoding="utf-8").read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Native Sparse Attention compiled by an MLIR dialect: "
            "PyTorch operators for the CPU (JIT) and CUDA (layers compiled "
            "ahead of time)\n"
            "Requires-Python: >=3.9\nRequires-Dist: torch>=2.5\n"
            "Requires-Dist: numpy\n"
            "Description-Content-Type: text/markdown\n\n" + readme)


def _tag():
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"py3-none-{platform}"


def _build():
    """Builds the project (scripts/setup.sh) and returns the build folder."""
    build = os.environ.get("NSA_BUILD_DIR") or os.path.join(SOURCE, "build")
    env = dict(os.environ, NSA_BUILD_DIR=build)
    if os.path.exists(os.path.join(build, "build.ninja")):
        # Configured already (and so not again): the tests' interpreter is
        # not needed to make a wheel, this one stands in, and setup.sh
        # makes no virtual environment.
        env.setdefault("NSA_PYTHON", sys.executable)
    subprocess.run([os.path.join(SOURCE, "scripts", "setup.sh")], env=env,
                   check=True, stdout=sys.stderr)
    return build


def _files(build):
    """(path in the wheel, path on disk) of every file the wheel holds."""
    package = os.path.join(build, "lib", "python", NAME)
    files = []
    for folder, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(names):
            disk = os.path.join(folder, name)
            files.append((os.path.relpath(disk, os.path.dirname(package)),
                          disk))
    for name in LIBRARIES:
        disk = os.path.join(build, "lib", name)
        if os.path.exists(disk):
            files.append((f"{NAME}/lib/{name}", os.path.realpath(disk)))
        elif name in REQUIRED:
            raise RuntimeError(f"nsa wheel: {disk} was not built")
    return files


def _record_row(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
    return [path, "sha256=" + digest.rstrip(b"=").decode(), str(len(data))]


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    build = _build()
    info = f"{NAME}-{VERSION}.dist-info"
    wheel = f"{NAME}-{VERSION}-{_tag()}.whl"
    entries = []
    for arc, disk in _files(build):
        with open(disk, "rb") as f:
            entries.append((arc, f.read(), os.stat(disk).st_mode))
    entries.append((f"{info}/METADATA", _metadata().encode(), 0o644))
    entries.append((f"{info}/WHEEL",
                    ("Wheel-Version: 1.0\nGenerator: nsa_build\n"
                     f"Root-Is-Purelib: false\nTag: {_tag()}\n").encode(),
                    0o644))
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arc, data, _ in entries:
        writer.writerow(_record_row(arc, data))
    writer.writerow([f"{info}/RECORD", "", ""])
    entries.append((f"{info}/RECORD", record.getvalue().encode(), 0o644))
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for arc, data, mode in entries:
            item = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
            item.external_attr = (mode & 0o777) << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(item, data)
    return wheel


def get_requires_for_build_wheel(config_settings=None):
    return []
