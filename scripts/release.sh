#!/usr/bin/env bash
# Cuts a release: checks that the version is SemVer and that the workspace (Cargo.toml), the
# chart (Chart.yaml version and appVersion) and a dated CHANGELOG section all name it; builds
# the images with that tag (scripts/images.sh, release profile) and packages the chart; with
# --registry, pushes both: the images as REGISTRY/ferrotrain/{operator,trainer}:VERSION and the
# chart as an OCI artifact, oci://REGISTRY/charts/ferrotrain, installable with a pinned
# version (docs/install.md).
#
#   scripts/release.sh VERSION [--check | --dry-run] [--registry REGISTRY] [--cuda]
#
#   --check            only the version checks (no build, no push)
#   --dry-run          every step but the images and the push, into a temporary directory,
#                      with the plugin of the last dev build (target/debug) when there is one;
#                      a version not ready yet is said, not refused; the chart package, the
#                      plugin archive and the krew manifest are checked: what CI runs
#   --registry REG     push the images and the chart to REG (e.g. ghcr.io/acme)
#   --cuda             also build (and push) ferrotrain/trainer-cuda
#
# The packaged chart is left in dist/ferrotrain-VERSION.tgz, the kubectl plugin in
# dist/kubectl-ferrotrain-VERSION-linux-ARCH.tar.gz with its krew manifest
# dist/krew-ferrotrain.yaml; the last line printed is the install command.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="" CHECK=0 DRY=0 REGISTRY="" CUDA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) CHECK=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --registry) REGISTRY="$2"; shift 2 ;;
    --cuda) CUDA=(--cuda); shift ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "release: unknown flag $1 (see --help)" >&2; exit 2 ;;
    *) VERSION="$1"; shift ;;
  esac
done
die() { echo "release: $*" >&2; exit 1; }
[[ -n $VERSION ]] || { echo "release: give the VERSION (see --help)" >&2; exit 2; }

# SemVer 2.0: MAJOR.MINOR.PATCH with an optional -prerelease.
semver='^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
[[ $VERSION =~ $semver ]] || die "$VERSION is not a SemVer version (MAJOR.MINOR.PATCH[-pre])"

field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *$/\1/p" charts/ferrotrain/Chart.yaml; }
cargo_version=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"/\1/p' Cargo.toml)
problems=()
[[ $cargo_version == "$VERSION" ]] || problems+=("Cargo.toml's workspace version is $cargo_version")
[[ $(field version) == "$VERSION" ]] || problems+=("charts/ferrotrain/Chart.yaml's version is $(field version)")
[[ $(field appVersion) == "$VERSION" ]] || problems+=("charts/ferrotrain/Chart.yaml's appVersion is $(field appVersion)")
grep -Eq "^## \[$VERSION\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$" CHANGELOG.md \
  || problems+=("CHANGELOG.md has no section '## [$VERSION] - YYYY-MM-DD'")
if ((${#problems[@]})) && [[ $DRY == 1 ]]; then
  printf 'release: dry run: %s would be refused:\n' "$VERSION"
  printf '  - %s\n' "${problems[@]}"
elif ((${#problems[@]})); then
  printf 'release: %s is not ready:\n' "$VERSION" >&2
  printf '  - %s\n' "${problems[@]}" >&2
  exit 1
else
  echo "release: $VERSION is SemVer and named by Cargo.toml, Chart.yaml and a dated CHANGELOG section"
fi
[[ $CHECK == 1 ]] && exit 0

HELM="${HELM_BIN:-$(scripts/setup-helm.sh | tail -n1)}"
dist=dist
if [[ $DRY == 1 ]]; then
  dist=$(mktemp -d)
  trap 'rm -rf "$dist"' EXIT
else
  scripts/images.sh --tag "$VERSION" --profile release "${CUDA[@]}"
fi
mkdir -p "$dist"
"$HELM" package charts/ferrotrain --version "$VERSION" --app-version "$VERSION" -d "$dist" >/dev/null
echo "release: packaged $dist/ferrotrain-$VERSION.tgz"

# The kubectl plugin (docs/cli.md), laid out as krew installs a plugin: the binary and the
# licence at the archive's top (and its man pages). A krew manifest (plugins/ferrotrain.yaml in
# krew-index) names, per platform, the archive's URL and sha256, `bin: kubectl-ferrotrain` and
# the files to copy; dist/krew-ferrotrain.yaml is that manifest for this build, its URL under
# the repository's releases, where the archive is to be uploaded.
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64|arm64) arch=arm64 ;;
  *) die "no plugin archive for $(uname -m)" ;;
esac
if [[ $DRY == 1 && -x target/debug/kubectl-ferrotrain ]]; then
  binary=target/debug/kubectl-ferrotrain
else
  cargo build --release -q -p kubectl-ferrotrain
  binary=target/release/kubectl-ferrotrain
fi
plugin="kubectl-ferrotrain-$VERSION-linux-$arch"
stage=$(mktemp -d)
cp "$binary" "$stage/kubectl-ferrotrain"
cp LICENSE "$stage/"
"$binary" man --dir "$stage/man"
tar -C "$stage" -czf "$dist/$plugin.tar.gz" kubectl-ferrotrain LICENSE man
rm -rf "$stage"
sha=$(sha256sum "$dist/$plugin.tar.gz" | cut -d' ' -f1)
repository=$(sed -n '/^\[workspace.package\]/,/^\[/ s/^repository = "\(.*\)"/\1/p' Cargo.toml)
cat > "$dist/krew-ferrotrain.yaml" <<KREW
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: ferrotrain
spec:
  version: v$VERSION
  homepage: $repository
  shortDescription: Submit, watch and account for ferrotrain's DistributedTraining jobs
  description: |
    Submits trainer configs and DistributedTraining jobs checked against the CRD's schema,
    watches a job with a live progress view, merges every rank's logs (replaced rounds' too)
    and prints the recovery ledger of each restart.
  platforms:
  - selector:
      matchLabels:
        os: linux
        arch: $arch
    uri: $repository/releases/download/v$VERSION/$plugin.tar.gz
    sha256: $sha
    files:
    - from: kubectl-ferrotrain
      to: .
    - from: LICENSE
      to: .
    bin: kubectl-ferrotrain
KREW
echo "release: packaged $dist/$plugin.tar.gz (sha256 $sha) and its krew manifest $dist/krew-ferrotrain.yaml"
if [[ $DRY == 1 ]]; then
  # What a user gets must install: the chart renders, the archive holds what the manifest
  # names, and the manifest's sha256 is the archive's.
  "$HELM" template ferrotrain "$dist/ferrotrain-$VERSION.tgz" >/dev/null \
    || die "the packaged chart does not render"
  listed=$(tar -tzf "$dist/$plugin.tar.gz" | sort | tr '\n' ' ')
  for want in kubectl-ferrotrain LICENSE man/; do
    [[ " $listed" == *" $want"* ]] || die "the plugin archive lacks $want ($listed)"
  done
  grep -q "sha256: $sha" "$dist/krew-ferrotrain.yaml" || die "the krew manifest's sha256 is not the archive's"
  echo "release: dry run of $VERSION passed: chart, plugin archive and krew manifest check out; no image built, nothing pushed"
  exit 0
fi
if [[ -z $REGISTRY ]]; then
  echo "release: no --registry: nothing pushed"
  echo "helm install ferrotrain dist/ferrotrain-$VERSION.tgz --namespace ferrotrain-system --create-namespace"
  exit 0
fi
images=(operator trainer)
((${#CUDA[@]})) && images+=(trainer-cuda)
for image in "${images[@]}"; do
  docker tag "ferrotrain/$image:$VERSION" "$REGISTRY/ferrotrain/$image:$VERSION"
  docker push "$REGISTRY/ferrotrain/$image:$VERSION"
done
"$HELM" push "dist/ferrotrain-$VERSION.tgz" "oci://$REGISTRY/charts"
echo "helm install ferrotrain oci://$REGISTRY/charts/ferrotrain --version $VERSION --namespace ferrotrain-system --create-namespace --set image.repository=$REGISTRY/ferrotrain/operator --set trainerImage.repository=$REGISTRY/ferrotrain/trainer"
