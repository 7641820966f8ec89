#!/usr/bin/env bash
# Build a real kube-apiserver (Debian's `kubernetes` 1.20.2 source package, offline Go build)
# into $CACHE/bin, once. No Debian package ships the binary; the integration tests need it
# (tests/fixtures/kube.py). A cached binary makes this a no-op in well under a second.
#
#   CACHE=$HOME/.cache/primus bash scripts/build-kube-apiserver.sh
#
# Needs golang-go, etcd-server (scripts/install-system.sh) and network access to a Debian
# source mirror for the first build (~7 min on 2 cores, 1.8 GB unpacked source, deleted after).
set -euo pipefail

CACHE=${CACHE:-$HOME/.cache/primus}
BIN_DIR="$CACHE/bin"
TARGET="$BIN_DIR/kube-apiserver"
# Bump when the build recipe changes, so a cached binary from an older recipe is rebuilt.
BUILD_ID="k8s-1.20.2+reflect2-1.0.2"

if [ -x "$TARGET" ] && [ "$(cat "$TARGET.build-id" 2>/dev/null)" = "$BUILD_ID" ]; then
  exit 0
fi

for tool in go etcd dpkg-source apt-get; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build-kube-apiserver: '$tool' is missing; run scripts/install-system.sh first (golang-go, etcd-server, dpkg-dev)" >&2
    exit 1
  fi
done

mkdir -p "$BIN_DIR"
WORK="$CACHE/kube-build"
rm -rf "$WORK"
mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/archives/partial" "$WORK/src"
trap 'rm -rf "$WORK"' EXIT

# A private deb-src list and apt state: the system's apt configuration stays untouched.
CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
# The Debian mirror this machine's apt already uses (deb822 sources or the classic list).
system_mirror() {
  { grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
    grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}'; } | grep -v -e security -e '^$' | head -n1
}
MIRROR=${DEBIAN_MIRROR:-$(system_mirror)}
[ -n "$MIRROR" ] || { echo "build-kube-apiserver: no Debian mirror configured; set DEBIAN_MIRROR" >&2; exit 1; }
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
echo "build-kube-apiserver: fetching the Debian 'kubernetes' source package"
apt-get "${APT_OPTS[@]}" update -qq
(cd "$WORK/src" && apt-get "${APT_OPTS[@]}" source --download-only kubernetes >/dev/null)
DSC=$(ls "$WORK"/src/kubernetes_*.dsc | head -n1)
(cd "$WORK/src" && dpkg-source --no-check -x "$DSC" tree >/dev/null)
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
echo "build-kube-apiserver: compiling cmd/kube-apiserver (several minutes)"
GOPATH="$SRC/.go" CGO_ENABLED=0 GOPROXY=off \
  make WHAT=cmd/kube-apiserver >"$WORK/build.log" 2>&1 || {
  tail -n 40 "$WORK/build.log" >&2
  echo "build-kube-apiserver: build failed" >&2
  exit 1
}
BUILT=$(find "$SRC/_output" -type f -name kube-apiserver -perm -u+x | head -n1)
if [ -z "$BUILT" ]; then
  echo "build-kube-apiserver: no kube-apiserver binary under _output" >&2
  exit 1
fi
install -m 0755 "$BUILT" "$TARGET.tmp"
mv "$TARGET.tmp" "$TARGET"
echo "$BUILD_ID" >"$TARGET.build-id"
"$TARGET" --version
