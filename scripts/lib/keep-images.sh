# keep_images TAG [IMAGE...]: one pod on each of the cluster kit's nodes whose containers use
# the pause image, this run's ferrotrain images and the other IMAGEs (the tests' own, e.g.
# ferrotrain/s3-e2e: each needs `sleep`), so that the kubelets' image garbage collection never
# removes them during the suite. Sourced by scripts/e2e.sh (after the kit's common.sh:
# FTC_DIR, PAUSE_IMAGE; KUBECONFIG set).
#
# Why: the kit's kubelets collect images above 95% disk use (imageGCHighThresholdPercent),
# and the disk they measure is the machine's whole shared disk (97-98% used on this project's
# machine: the kubelet logs "Removing image to free bytes" every 5 minutes). A kubelet keeps
# only the images that some container on its node uses, and containerd 1.6 does not report the
# sandbox image as pinned, so it removed ft.local/pause (no pod sandbox could start afterwards:
# "failed to pull image ft.local/pause:3.10.2") and the trainer image between two tests (CI
# failed on both). Reported to the kit's maintainers; these pods only hold the images in use.
KEEP_NAMESPACE=ferrotrain-e2e-images

keep_images() {
  local tag="$1" node extra="" image i=0 key
  shift
  for image in "$@"; do
    i=$((i + 1))
    extra+="  - {name: extra-$i, image: \"$image\", imagePullPolicy: Never, command: [sleep, infinity]}"$'\n'
  done
  # A pod's containers cannot change: another set of images is another pod (same tag suffix).
  key=$(printf '%s\n' "$@" | sha256sum | cut -c1-6)
  kubectl create namespace "$KEEP_NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  # Another run's pods held its images: gone, those can be collected (this run's stay).
  kubectl -n "$KEEP_NAMESPACE" get pods -o name | { grep -v -- "-$key-$tag\$" || true; } \
    | xargs -r kubectl -n "$KEEP_NAMESPACE" delete --wait=false >/dev/null
  for node in "$FTC_DIR"/nodes/*/; do
    node=$(basename "$node")
    kubectl -n "$KEEP_NAMESPACE" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: images-$node-$key-$tag
  labels: {app.kubernetes.io/name: ferrotrain-e2e-images}
spec:
  nodeName: $node
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  automountServiceAccountToken: false
  # A node made unreachable by a test keeps its images too.
  tolerations: [{operator: Exists}]
  containers:
  - {name: pause, image: "$PAUSE_IMAGE", imagePullPolicy: Never}
  - {name: trainer, image: "ferrotrain/trainer:$tag", imagePullPolicy: Never,
     command: [sleep, infinity]}
  # The operator image has no shell: its container runs --help and stays as an exited
  # container of a live pod, which the kubelet counts as using the image.
  - {name: operator, image: "ferrotrain/operator:$tag", imagePullPolicy: Never,
     command: [ferrotrain-operator, --help]}
$extra
EOF
  done
}
