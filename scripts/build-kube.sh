#!/usr/bin/env bash
# Build a real Kubernetes control plane (kube-apiserver, kube-scheduler, kube-controller-manager
# from Debian's `kubernetes` 1.20.2 source package, offline Go build) into $CACHE/bin, once. No
# Debian package ships the binaries; the integration tests need them (tests/fixtures/kube.py).
# Cached binaries make this a no-op in well under a second.
#
#   CACHE=$HOME/.cache/primus bash scripts/build-kube.sh
#
# Needs golang-go, etcd-server (scripts/install-system.sh) and network access to a Debian
# source mirror for the first build (~12 min on 2 cores, 1.8 GB unpacked source, deleted after).
set -euo pipefail
step="start"
trap 'echo "build-kube: FAILED during: $step (exit $?)" >&2' ERR

CACHE=${CACHE:-$HOME/.cache/primus}
BIN_DIR="$CACHE/bin"
COMPONENTS=(kube-apiserver kube-scheduler kube-controller-manager)
# Bump when the build recipe changes, so cached binaries from an older recipe are rebuilt.
BUILD_ID="k8s-1.20.2+reflect2-1.0.2+sched-cm"

cached() {
  local c
  for c in "${COMPONENTS[@]}"; do
    [ -x "$BIN_DIR/$c" ] && [ "$(cat "$BIN_DIR/$c.build-id" 2>/dev/null)" = "$BUILD_ID" ] || return 1
  done
}
if cached; then
  exit 0
fi

step="checking tools"
# Kubernetes 1.20 wants Debian's Go (1.19), not a newer `go` that may come first on PATH.
DEBIAN_GO=$(ls -d /usr/lib/go-1.* 2>/dev/null | sort -V | tail -n1 || true)
[ -n "$DEBIAN_GO" ] && export PATH="$DEBIAN_GO/bin:$PATH"
for tool in go etcd dpkg-source apt-get; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-kube: '$tool' is missing; run scripts/install-system.sh first (golang-go, etcd-server, dpkg-dev)" >&2
    exit 1
  fi
done
echo "build-kube: building ${COMPONENTS[*]} with $(go version)"

mkdir -p "$BIN_DIR"
WORK="$CACHE/kube-build"
rm -rf "$WORK"
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/archives/partial" "$WORK/src"
trap 'rm -rf "$WORK"' EXIT

# A private deb-src list and apt state: the system's apt configuration stays untouched.
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
# The Debian mirror this machine's apt already uses (deb822 sources or the classic list).
# Either file may be missing (a new machine has only deb822 sources), so no grep may fail the script.
system_mirror() {
  local files=()
  shopt -s nullglob
  files=(/etc/apt/sources.list.d/*.sources)
  shopt -u nullglob
  { [ ${#files[@]} -gt 0 ] && awk '/^URIs:/ {print $2}' "${files[@]}"
    [ -f /etc/apt/sources.list ] && awk '/^deb / {print $2}' /etc/apt/sources.list
    true; } | { grep -v -e security -e '^$' || true; } | head -n1
}
step="finding the Debian mirror"
MIRROR=${DEBIAN_MIRROR:-$(system_mirror)}
[ -n "$MIRROR" ] || { echo "build-kube: no Debian mirror configured; set DEBIAN_MIRROR" >&2; exit 1; }
cat >"$WORK/apt/sources.list" <<EOF
deb $MIRROR $CODENAME main
deb-src $MIRROR $CODENAME main
EOF
APT_OPTS=(
  -o "Dir::Etc::SourceList=$WORK/apt/sources.list"
  -o "Dir::Etc::SourceParts=-"
  -o "Dir::State::Lists=$WORK/apt/lists"
  -o "Dir::Cache::Archives=$WORK/apt/archives"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
)
step="fetching the Debian 'kubernetes' source package"
echo "build-kube: $step"
apt-get "${APT_OPTS[@]}" update -qq
(cd "$WORK/src" && apt-get "${APT_OPTS[@]}" source --download-only kubernetes >/dev/null)
DSC=$(ls "$WORK"/src/kubernetes_*.dsc | head -n1)
step="unpacking $DSC"
(cd "$WORK/src" && dpkg-source --no-check -x "$DSC" tree >/dev/null)
step="swapping in Debian's reflect2 1.0.2"
# The vendored modern-go/reflect2 1.0.1 breaks under Go >= 1.18 (the apiserver dies with "fatal
# error: fault" in mapiterinit when it encodes a custom resource); Debian's 1.0.2 has the fix.
(cd "$WORK/src" && apt-get "${APT_OPTS[@]}" download golang-github-modern-go-reflect2-dev >/dev/null)
dpkg-deb -x "$(ls "$WORK"/src/golang-github-modern-go-reflect2-dev_*.deb | head -n1)" "$WORK/reflect2"
rm -rf "$WORK/src/tree/vendor/github.com/modern-go/reflect2"
cp -r "$WORK/reflect2/usr/share/gocode/src/github.com/modern-go/reflect2" "$WORK/src/tree/vendor/github.com/modern-go/"

SRC="$WORK/src/tree"
cd "$SRC"
# hack/lib/golang.sh copies built binaries with `rsync -pc FILE DIR`; where rsync is not
# installed, a two-line stand-in with the same effect for that call is enough.
if ! command -v rsync >/dev/null 2>&1; then
  mkdir -p "$WORK/shim"
  printf '#!/bin/sh\n# rsync -pc SRC DST stand-in for the kubernetes build\nshift $(($# - 2)); cp -p "$1" "$2"\n' >"$WORK/shim/rsync"
  chmod +x "$WORK/shim/rsync"
  export PATH="$WORK/shim:$PATH"
fi
mkdir -p .go/src/k8s.io
ln -sfn ../../.. .go/src/k8s.io/kubernetes
step="compiling ${COMPONENTS[*]}"
echo "build-kube: $step (about 12 minutes on 2 cores)"
WHAT=""
for c in "${COMPONENTS[@]}"; do WHAT="$WHAT cmd/$c"; done
GOPATH="$SRC/.go" CGO_ENABLED=0 GOPROXY=off \
  make WHAT="${WHAT# }" >"$WORK/build.log" 2>&1 || {
  tail -n 40 "$WORK/build.log" >&2
  echo "build-kube: build failed (go: $(go version))" >&2
  exit 1
}
step="installing the binaries into $BIN_DIR"
for c in "${COMPONENTS[@]}"; do
  BUILT=$(find "$SRC/_output" -type f -name "$c" -perm -u+x | head -n1)
  if [ -z "$BUILT" ]; then
    echo "build-kube: no $c binary under _output" >&2
    exit 1
  fi
  install -m 0755 "$BUILT" "$BIN_DIR/$c.tmp"
  mv "$BIN_DIR/$c.tmp" "$BIN_DIR/$c"
  echo "$BUILD_ID" >"$BIN_DIR/$c.build-id"
  "$BIN_DIR/$c" --version
done
