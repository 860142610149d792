#!/usr/bin/env bash
# Checkpoints in a bucket, measured: a 72 MB state (the Multi30k recipe's) saved three times
# with `checkpoint.store`, against s3s-fs (the S3 server of the end-to-end tests, built by
# scripts/setup-s3s-fs.sh) on a loopback port: the save's blocking time, the local commit,
# the time until the checkpoint is durable in the bucket, the upload rate; then a resume on
# an empty directory from the bucket against one from the local disk. Prints the numbers
# (docs/performance.md keeps them).
#
#   bench/checkpoint-bucket.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
server=$(scripts/setup-s3s-fs.sh | tail -1)
data=$(mktemp -d)
pid=""
cleanup() { [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; rm -rf "$data"; }
trap cleanup EXIT
mkdir -p "$data/ckpt"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$server" --host 127.0.0.1 --port "$port" --access-key bench --secret-key bench-secret "$data" \
  >"$data/server.log" 2>&1 &
pid=$!
for _ in $(seq 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret
export FERROTRAIN_BENCH_S3_ENDPOINT="http://127.0.0.1:$port" CKPT_MEASURE_DIR="$data"
echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%d), $(nproc) cores, s3s-fs on 127.0.0.1"
cargo test --release -q -p ferrotrain-trainer --lib checkpoint::bucket::tests::measure_72mb_bucket \
  -- --ignored --nocapture 2>&1 | grep -E "^(save|resume)"
