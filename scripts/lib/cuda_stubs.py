#!/usr/bin/env python3
"""Stubs of the CUDA libraries the PyPI torch wheel links, for CPU-only installs of it.

PyPI's torch wheel for Linux is the CUDA build: `import torch` loads libtorch_cuda.so, which
needs cuBLAS, cuDNN, cuFFT, cuSPARSE, NCCL, NVSHMEM, ... (about 3 GB of nvidia-* wheels), and
PyPI is the index this project can reach (the CPU-only wheels live on download.pytorch.org).
A CPU install ships the two small real ones torch's CPU library links (libcudart, libcupti:
without a GPU, cudart reports no device, so torch.cuda.is_available() is False) and, for the
others, a small library each with the same SONAME, the same symbol versions and every symbol
torch's libraries take from it: a function that says it is a stub and returns 1 (an error
status for these APIs). Nothing calls them on the CPU; the loader only needs them to exist.

    cuda_stubs.py TORCH_DIR OUT_DIR [REAL_LIB_DIR]

TORCH_DIR is an unpacked torch package (torch/lib/*.so, torch/_C*.so, ...), OUT_DIR gets the
stubs (lib*.so.N), REAL_LIB_DIR holds the real libraries that need no stub. Needs readelf and
a C compiler (cc).
"""

import os
import re
import subprocess
import sys
import tempfile

# Unversioned symbols' libraries, by prefix (longest first); versioned ones name their own.
PREFIXES = [
    ("cusparseLt", "libcusparseLt.so.0"),
    ("cuFile", "libcufile.so.0"),
    ("nccl", "libnccl.so.2"),
    ("nvshmem", "libnvshmem_host.so.3"),
    ("nvrtc", "libnvrtc.so.13"),
    ("curand", "libcurand.so.10"),
    ("cu", "libcuda.so.1"),
]
CUDA_LIB = re.compile(r"^lib(cu|nccl|nvshmem|nvrtc|nvJitLink|nvToolsExt)")


def elf_files(root):
    for d, _, names in os.walk(root):
        for n in names:
            if ".so" in n:
                p = os.path.join(d, n)
                with open(p, "rb") as f:
                    if f.read(4) == b"\x7fELF":
                        yield p


def readelf(args, path):
    return subprocess.run(["readelf", "-W", *args, path], capture_output=True, text=True).stdout


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf(["-d"], path))


def undefined(path):
    """(name, version or None) of every undefined, non-weak function or object symbol."""
    out = []
    for line in readelf(["--dyn-syms"], path).splitlines():
        f = line.split()
        if len(f) < 8 or f[6] != "UND" or f[4] == "WEAK" or f[3] not in ("FUNC", "NOTYPE", "OBJECT"):
            continue
        name, _, version = f[7].partition("@")
        version = version.split(" ")[0].lstrip("@") or None
        out.append((name, version))
    return out


def version_files(path):
    """{version name: the library it is needed from} of the file's version needs."""
    out, current = {}, None
    for line in readelf(["-V"], path).splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)", line)
        if m and current:
            out[m.group(1)] = current
    return out


def main():
    torch_dir, out_dir = sys.argv[1], sys.argv[2]
    real = set(os.listdir(sys.argv[3])) if len(sys.argv) > 3 else set()
    files = list(elf_files(torch_dir))
    own = {os.path.basename(p) for p in files}
    stubs = {}
    for p in files:
        for lib in needed(p):
            if CUDA_LIB.match(lib) and lib not in own and lib not in real:
                stubs.setdefault(lib, {})
    for p in files:
        files_of = version_files(p)
        for name, version in undefined(p):
            lib = files_of.get(version)
            if version and lib in stubs:
                stubs[lib][name] = version
            elif not version:
                for prefix, lib in PREFIXES:
                    if name.startswith(prefix) and lib in stubs:
                        stubs[lib].setdefault(name, None)
                        break
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for lib, symbols in sorted(stubs.items()):
            c = os.path.join(tmp, lib + ".c")
            with open(c, "w") as f:
                f.write("#include <stdio.h>\n#include <stdlib.h>\n")
                f.write("static int told;\n")
                f.write(
                    "static long stub(const char *name) {\n"
                    "  if (!told++) fprintf(stderr, \"ferrotrain: %s is a stub in this CPU-only "
                    f"install of torch (no CUDA): %s returns an error\\n\", \"{lib}\", name);\n"
                    "  return 1;\n}\n"
                )
                for name in sorted(symbols):
                    f.write(f'long {name}(void) {{ return stub("{name}"); }}\n')
            cmd = ["cc", "-shared", "-fPIC", "-O1", "-o", os.path.join(out_dir, lib), c, f"-Wl,-soname,{lib}"]
            versions = sorted({v for v in symbols.values() if v})
            if versions:
                # Each version node with its symbols; unversioned ones go in the first.
                script = os.path.join(tmp, lib + ".map")
                with open(script, "w") as f:
                    for i, version in enumerate(versions):
                        names = sorted(n for n, v in symbols.items() if v == version or (i == 0 and not v))
                        local = " local: *;" if i == 0 else ""
                        f.write(f"{version} {{ global: {' '.join(n + ';' for n in names)}{local} }};\n")
                cmd.append(f"-Wl,--version-script={script}")
            subprocess.run(cmd, check=True)
            print(f"stub {lib}: {len(symbols)} symbols")


main()
