#!/usr/bin/env bash
# Install kwok (sigs.k8s.io/kwok: simulated nodes and pod lifecycles for a real API server) into
# $CACHE/bin, once. The Kubernetes tests run it next to the kube-apiserver, kube-scheduler and
# kube-controller-manager built by scripts/build-kube.sh (tests/fixtures/kube.py): kwok keeps the
# fake Nodes Ready (status + leases) and moves pods the scheduler bound to them to Running.
#
#   CACHE=$HOME/.cache/primus bash scripts/install-kwok.sh
#
# Built from the Go module proxy with the machine's modern Go (/usr/local/go; Debian's old Go,
# which scripts/build-kube.sh uses for Kubernetes 1.20, is too old for kwok). GOPATH, the module
# cache and the build cache live under $CACHE, so an empty $CACHE is a really fresh install (the
# module cache is left writable, -modcacherw, so `rm -rf $CACHE` works without root).
# A cached binary of the pinned version makes this a no-op.
set -euo pipefail
step="start"
trap 'echo "install-kwok: FAILED during: $step (exit $?)" >&2' ERR

# v0.7.0 (client-go 0.33) is checked against the 1.20.2 apiserver of the tests: node leases
# (coordination.k8s.io/v1), node and pod status patches. Bump deliberately, then rerun the k8s tests.
KWOK_VERSION="v0.7.0"
CACHE=${CACHE:-$HOME/.cache/primus}
BIN_DIR="$CACHE/bin"
TARGET="$BIN_DIR/kwok"

if [ -x "$TARGET" ] && [ "$(cat "$TARGET.version" 2>/dev/null)" = "$KWOK_VERSION" ]; then
  exit 0
fi

step="finding a Go toolchain"
GO=${GO:-}
if [ -z "$GO" ]; then
  for candidate in /usr/local/go/bin/go "$(command -v go || true)"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    # kwok v0.7 needs Go >= 1.24; Debian bookworm's golang-go is 1.19.
    minor=$({ "$candidate" env GOVERSION 2>/dev/null || true; } | sed -E 's/^go1\.([0-9]+).*/\1/')
    if [ "${minor:-0}" -ge 24 ]; then
      GO=$candidate
      break
    fi
  done
fi
if [ -z "$GO" ]; then
  echo "install-kwok: no Go >= 1.24 found (looked at /usr/local/go/bin/go and PATH); set GO=/path/to/go" >&2
  step="finding a Go toolchain (none >= 1.24)"
  false
fi

step="go install sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION with $("$GO" env GOVERSION)"
echo "install-kwok: $step (a few minutes on 2 cores)"
mkdir -p "$BIN_DIR" "$CACHE/go"
# go install writes the binary only after a successful build; the version stamp comes last.
rm -f "$TARGET.version"
GOTOOLCHAIN=local CGO_ENABLED=0 \
  GOPATH="$CACHE/go" GOMODCACHE="$CACHE/go/pkg/mod" GOCACHE="$CACHE/go/build-cache" GOBIN="$BIN_DIR" \
  "$GO" install -modcacherw "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"

step="checking $TARGET"
"$TARGET" --version >/dev/null
echo "$KWOK_VERSION" >"$TARGET.version"
# The build cache (~850 MB) is of no further use; the module cache stays for a later version bump.
rm -rf "$CACHE/go/build-cache"
"$TARGET" --version
