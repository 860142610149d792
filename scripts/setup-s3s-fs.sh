#!/usr/bin/env bash
# Builds s3s-fs, an S3-compatible server over a directory (SigV4, multipart uploads,
# ListObjectsV2, conditional PUTs), from crates.io into a cache outside the repo, once: the
# checkpoint bucket of the end-to-end tests (e2e/src/s3.rs), which scripts/images.sh puts in
# the test-only image ferrotrain/s3-e2e. The version is docker/versions.env's S3S_FS_VERSION
# (0.17 needs a newer rustc than the project's), built with its own Cargo.lock (--locked).
# Idempotent: a complete build (marked by .complete, holding its version) is reused; about
# 3 minutes on 2 cores the first time. Prints the binary's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
. docker/versions.env
VERSION="$S3S_FS_VERSION"
CACHE_ROOT="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}"
DEST="$CACHE_ROOT/s3s-fs"

if [[ -f "$DEST/.complete" && "$(cat "$DEST/.complete")" == "$VERSION" ]]; then
  echo "$DEST/s3s-fs"
  exit 0
fi

command -v cargo >/dev/null || { echo "setup-s3s-fs: cargo is required" >&2; exit 1; }
mkdir -p "$CACHE_ROOT"
work=$(mktemp -d "$CACHE_ROOT/tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT

started=$SECONDS
echo "setup-s3s-fs: cargo install s3s-fs@$VERSION (once; about 3 minutes on 2 cores)" >&2
# A target directory of its own: never the workspace's (CARGO_TARGET_DIR may point there).
CARGO_TARGET_DIR="$work/target" cargo install --locked --quiet "s3s-fs@$VERSION" \
  --features binary --root "$work/root" >&2
"$work/root/bin/s3s-fs" --version | grep -qx "s3s-fs $VERSION" \
  || { echo "setup-s3s-fs: the built s3s-fs is not version $VERSION" >&2; exit 1; }
mkdir -p "$work/stage"
mv "$work/root/bin/s3s-fs" "$work/stage/s3s-fs"
echo "$VERSION" > "$work/stage/.complete"
rm -rf "$DEST"
mv "$work/stage" "$DEST"
echo "setup-s3s-fs: built in $((SECONDS - started)) s" >&2
echo "$DEST/s3s-fs"
