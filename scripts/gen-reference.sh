#!/usr/bin/env bash
# Rewrites the reference generated from the code (docs/reference/: the CRD's fields, every
# command line, the metrics, the reasons, the environment variables). The generators are the
# drift tests themselves, run here with FERROTRAIN_REGENERATE=1: operator/tests/reference.rs
# for every page but `ferrotrain`'s command line, which only its binary can print
# (`ferrotrain reference cli`, trainer/tests/reference.rs; it links libtorch, hence env.sh);
# the kubectl plugin's command line by kubectl/tests/reference.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
FERROTRAIN_REGENERATE=1 cargo test -q -p ferrotrain-operator --test reference
FERROTRAIN_REGENERATE=1 cargo test -q -p ferrotrain-trainer --test reference
FERROTRAIN_REGENERATE=1 cargo test -q -p kubectl-ferrotrain --test reference
echo "wrote docs/reference/"
