#!/usr/bin/env bash
# checkov's Kubernetes checks on the Helm chart as rendered, on the objects the operator creates
# for the example jobs (and on more manifests when given), with each failed check either
# justified in scripts/scan/justified.tsv (and docs/security-checks.md) or failing the scan.
#
#   scripts/scan.sh [MANIFEST_FILE_OR_DIR...]   the chart, rendered three times (default values,
#                                               both images pinned by digest, every monitoring
#                                               object on and pinned); the Service,
#                                               Secret, ConfigMap, NetworkPolicy and pods of
#                                               examples/copy-dt.yaml and the GPU job
#                                               examples/translation-gpu-dt.yaml, rendered by
#                                               the operator binary twice (the chart's default
#                                               trainer image, and pinned by digest); plus the
#                                               YAML (multi-document too) in the files and
#                                               dirs given
#   scripts/scan.sh --self-test                 only scripts/scan/fixtures/: a privileged pod,
#                                               which must fail CKV_K8S_16 (the scan exits 1)
#
# Exit status: 0 every failed check is justified; 1 a failed check is not (in --self-test:
# the expected outcome); 2 the scan itself failed (install, helm, checkov, a file that is not
# YAML, an input with nothing to check). Warns of justifications that match nothing.
# checkov (pinned below) is installed from PyPI into a venv in the cache beside helm's
# (scripts/setup-helm.sh), once. Needs target/debug/ferrotrain-operator (cargo build -p
# ferrotrain-operator; or set FERROTRAIN_OPERATOR_BIN), except for --self-test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/python-tool.sh

CHECKOV_VERSION=3.3.30
CACHE_ROOT="${FERROTRAIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ferrotrain}"
VENV="$CACHE_ROOT/checkov"
JUSTIFIED=scripts/scan/justified.tsv
OPERATOR="${FERROTRAIN_OPERATOR_BIN:-target/debug/ferrotrain-operator}"
# The jobs whose objects are scanned: a CPU job and a GPU job (gpusPerReplica).
EXAMPLES=(examples/copy-dt.yaml examples/translation-gpu-dt.yaml)
# Any valid digest: the pinned rendering checks that the chart renders repository@digest.
PIN=sha256:0000000000000000000000000000000000000000000000000000000000000000

die() { echo "scan: $*" >&2; exit 2; }

self_test=0
inputs=()
for arg in "$@"; do
  case "$arg" in
    --self-test) self_test=1 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option $arg (see --help)" ;;
    *) [[ -e "$arg" ]] || die "$arg does not exist"; inputs+=("$arg") ;;
  esac
done
if [[ $self_test == 1 ]]; then
  [[ ${#inputs[@]} == 0 ]] || die "--self-test scans its fixture only"
  inputs=(scripts/scan/fixtures)
else
  [[ -x "$OPERATOR" ]] || die "$OPERATOR is missing: cargo build -p ferrotrain-operator (or set FERROTRAIN_OPERATOR_BIN)"
fi

# --- checkov, in its own venv --------------------------------------------------------------
ensure_python_tool "$VENV" checkov "$CHECKOV_VERSION" || die "cannot install checkov"

# --- what to scan: one subdirectory of $root per input ------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/ferrotrain-scan.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/scan"
mkdir -p "$root"
# What each subdirectory of $root holds, for the report (outside $root: checkov scans it all).
inputs_tsv="$work/inputs.tsv"
: > "$inputs_tsv"

if [[ $self_test == 0 ]]; then
  helm="$(scripts/setup-helm.sh | tail -n1)" || die "scripts/setup-helm.sh failed"
  mkdir "$root/chart"
  # The namespace the README installs into (a rendering without one lands in "default").
  "$helm" template ferrotrain charts/ferrotrain --namespace ferrotrain-system \
    > "$root/chart/defaults.yaml" || die "helm template failed"
  "$helm" template ferrotrain-pinned charts/ferrotrain --namespace ferrotrain-system \
    --set image.digest=$PIN --set trainerImage.digest=$PIN \
    > "$root/chart/pinned.yaml" || die "helm template (pinned) failed"
  # Every optional object on (the monitors, the rule, the dashboards' ConfigMap), pinned.
  "$helm" template ferrotrain-monitoring charts/ferrotrain --namespace ferrotrain-system \
    --set image.digest=$PIN --set trainerImage.digest=$PIN \
    --set monitoring.serviceMonitor.enabled=true --set monitoring.podMonitor.enabled=true \
    --set monitoring.prometheusRule.enabled=true --set monitoring.dashboard.enabled=true \
    > "$root/chart/monitoring.yaml" || die "helm template (monitoring) failed"
  printf 'chart\tdir\trendered-chart\n' >> "$inputs_tsv"

  # The operator's objects for the example jobs, as `ferrotrain-operator render` prints them
  # with the chart's settings: its pods' labels and namespace (the jobs' NetworkPolicies name
  # them), and the trainer image as the chart's default values give it (a tag) and as
  # trainerImage.digest pins it. The examples name no namespace (kubectl puts them in the
  # current one; render, in "default", which would fail CKV_K8S_21 on every object): they are
  # rendered into namespace "examples" (and "examples-pinned"), as the chart is into a real one.
  mkdir "$root/operator"
  for example in "${EXAMPLES[@]}"; do
    name=$(basename "$example" .yaml)
    for variant in default pinned; do
      namespace=examples image=()
      if [[ $variant == pinned ]]; then
        namespace=examples-pinned image=(--trainer-image "ferrotrain/trainer@$PIN")
      fi
      "$VENV/bin/python" -B -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d.get("kind") == "DistributedTraining":
        d["metadata"].setdefault("namespace", sys.argv[2])
yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)' "$example" "$namespace" \
        | RUST_BACKTRACE=0 "$OPERATOR" render -f - "${image[@]}" \
          --pod-labels app.kubernetes.io/name=ferrotrain-operator,app.kubernetes.io/instance=ferrotrain \
          --pod-namespace ferrotrain-system > "$root/operator/$name.$variant.yaml" \
        || die "ferrotrain-operator render $example ($variant) failed"
    done
  done
  printf 'operator\tdir\trendered-by-operator\n' >> "$inputs_tsv"
fi

n=0
for input in "${inputs[@]}"; do
  n=$((n + 1))
  dest="$root/input-$n"
  mkdir "$dest"
  if [[ -d "$input" ]]; then
    cp -R "$input/." "$dest/"
    printf 'input-%d\tdir\t%s\n' "$n" "${input%/}" >> "$inputs_tsv"
  else
    # checkov reads .yaml/.yml/.json files only.
    name=$(basename "$input")
    [[ "$name" =~ \.(ya?ml|json)$ ]] || name="$name.yaml"
    cp "$input" "$dest/$name"
    printf 'input-%d\tfile\t%s\n' "$n" "$input" >> "$inputs_tsv"
  fi
done

# --- the scan ------------------------------------------------------------------------------
# --skip-download: no calls to Prisma Cloud (descriptions, severities); --soft-fail: exit 0 with
# failed checks (the report decides), so a non-zero status means checkov itself failed.
started=$SECONDS
"$VENV/bin/checkov" --framework kubernetes --directory "$root" --output json --compact \
  --skip-download --soft-fail > "$work/report.json" 2> "$work/checkov.log" \
  || { cat "$work/checkov.log" >&2; die "checkov failed"; }
echo "scan: checkov ran in $((SECONDS - started)) s" >&2

expect=()
[[ $self_test == 0 ]] || expect=(--expect CKV_K8S_16)
"$VENV/bin/python" -B scripts/scan/report.py "$work/report.json" "$JUSTIFIED" "$root" "$inputs_tsv" \
  "${expect[@]}"
