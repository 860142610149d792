#!/usr/bin/env bash
# Takes a screenshot of TensorBoard showing a run's event files, as docs/observability.md's:
#
#   scripts/tensorboard-screenshot.sh runs/multi30k/tensorboard docs/images/tensorboard-multi30k.png
#
# TensorBoard comes from the same cached venv the read-back test uses
# (~/.cache/ferrotrain/tb-venv, tensorboard 2.20.0); the browser is Debian's Chromium, headless
# (installed with apt-get when missing and running as root). TensorBoard listens on an
# ephemeral loopback port and is stopped on exit, also on failure.
set -euo pipefail
logdir="${1:?usage: $0 LOGDIR OUT.png [WIDTHxHEIGHT]}"
out="${2:?usage: $0 LOGDIR OUT.png [WIDTHxHEIGHT]}"
size="${3:-1600x1100}"
venv="$HOME/.cache/ferrotrain/tb-venv"

if [[ ! -x "$venv/bin/tensorboard" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q tensorboard==2.20.0
fi
if ! command -v chromium >/dev/null; then
  [[ $(id -u) == 0 ]] || { echo "install Debian's chromium package first" >&2; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
tb_log=$(mktemp)
profile=$(mktemp -d)
"$venv/bin/tensorboard" --logdir "$logdir" --host 127.0.0.1 --port "$port" >"$tb_log" 2>&1 &
tb=$!
trap 'kill $tb 2>/dev/null; wait $tb 2>/dev/null; rm -rf "$profile" "$tb_log"' EXIT

for _ in $(seq 1 60); do
  curl -sf "http://127.0.0.1:$port/data/runs" >/dev/null && break
  kill -0 $tb 2>/dev/null || { cat "$tb_log" >&2; exit 1; }
  sleep 0.5
done
curl -sf "http://127.0.0.1:$port/data/runs" >/dev/null || { cat "$tb_log" >&2; exit 1; }

mkdir -p "$(dirname "$out")"
# The flags keep Chromium off the network this machine does not have (background updates,
# sync, QUIC) and give it a fresh profile; the virtual time budget lets the page load its
# scalars and draw the charts before the shot.
timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --window-size="${size/x/,}" \
  --virtual-time-budget=20000 --screenshot="$out" \
  "http://127.0.0.1:$port/${TB_FRAGMENT:-#scalars&_smoothingWeight=0.6&tagFilter=loss%7Cbleu%7Clearning_rate%7Ctokens_per_second}" 2>/dev/null
echo "wrote $out"
