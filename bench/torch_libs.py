"""Prints the library folders of the torch wheel and of every nvidia-* wheel beside it,
joined with ':' for LD_LIBRARY_PATH: what a CUDA build of the trainer loads on a GPU machine
that has a Python with torch and no libtorch of its own (bench/gpu-validate.sh,
bench/multi30k-gpu-sweep.sh)."""

import glob
import os

import torch

site = os.path.dirname(os.path.dirname(torch.__file__))
dirs = [os.path.join(os.path.dirname(torch.__file__), "lib")]
dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
dirs += sorted(glob.glob(os.path.join(site, "nvidia", "cu*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
