#!/usr/bin/env bash
# Runs every fuzz target (every test named fuzz_*: the store's frames, connection and
# handshake, the termination message, the trainer config, a checkpoint file, tokenizer.json,
# requests to rank 0's progress server) for SECONDS each (default 120) and prints, per target, the
# executions, the corpus size, the distinct outcomes reached and the findings (each saved
# under $FERROTRAIN_FUZZ_FINDINGS, default target/fuzz-findings/). The same targets run for
# 3 seconds each in the test suite. SEED changes the mutations (default: the suite's seed).
#
#   bench/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh >/dev/null
export FERROTRAIN_FUZZ_SECONDS="${1:-120}"
export FERROTRAIN_FUZZ_SEED="${SEED:-$(date +%s)}"
export FERROTRAIN_FUZZ_FINDINGS="${FERROTRAIN_FUZZ_FINDINGS:-$PWD/target/fuzz-findings}"
echo "fuzz: ${FERROTRAIN_FUZZ_SECONDS} s per target, seed ${FERROTRAIN_FUZZ_SEED}, findings under ${FERROTRAIN_FUZZ_FINDINGS}"
# One target at a time: each measures its own allocations and the cores are shared.
cargo nextest run --workspace --no-fail-fast --test-threads 1 --no-capture \
    -E 'test(/^fuzz_/)' 2>&1 | grep -E '^(fuzz |  finding:)|FAIL|panicked' || true
