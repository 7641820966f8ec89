#!/usr/bin/env bash
# Fetch Hadoop's minicluster jars from Maven Central and build the launcher of infra/hadoop
# (org.primus.minicluster.MiniClusterMain: a real HDFS and YARN on loopback for the tests,
# tests/fixtures/hadoop.py) into $CACHE/jars/hadoop-<version>/, once.
#
#   CACHE=$HOME/.cache/primus bash scripts/fetch-hadoop.sh
#
# Needs Java 17 and Maven (first run: ~110 MB from Maven Central into $CACHE/m2). The folder's
# .stamp holds the version and a hash of infra/hadoop's pom and sources: a change rebuilds, an
# up-to-date copy makes this a no-op in well under a second.
set -euo pipefail
step="start"
trap 'echo "fetch-hadoop: FAILED during: $step (exit $?)" >&2' ERR

CACHE=${CACHE:-$HOME/.cache/primus}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC="$ROOT/infra/hadoop"

step="hashing $SRC"
VERSION=$(sed -n 's:.*<hadoop.version>\(.*\)</hadoop.version>.*:\1:p' "$SRC/pom.xml" | head -n1)
[ -n "$VERSION" ]
# The same hash as tests/fixtures/hadoop.py's source_hash(): pom.xml, then src/ files in byte order.
HASH=$(cd "$SRC" && { find src -type f | LC_ALL=C sort | xargs cat pom.xml; } | sha256sum | cut -c1-16)
DEST="$CACHE/jars/hadoop-$VERSION"
STAMP_TEXT="hadoop-$VERSION $HASH"
if [ "$(cat "$DEST/.stamp" 2>/dev/null)" = "$STAMP_TEXT" ]; then
  exit 0
fi

step="locking $CACHE/jars"
mkdir -p "$CACHE/jars" "$CACHE/m2"
exec 9>"$CACHE/jars/.hadoop.lock"
flock 9  # a concurrent run builds first; then the stamp below is current
if [ "$(cat "$DEST/.stamp" 2>/dev/null)" = "$STAMP_TEXT" ]; then
  exit 0
fi

step="checking tools"
for tool in java mvn; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fetch-hadoop: '$tool' is missing (Java 17 and Maven are needed)" >&2
    exit 1
  fi
done
echo "fetch-hadoop: building the Hadoop $VERSION minicluster launcher into $DEST"

step="preparing a build folder"
WORK=$(mktemp -d "$CACHE/jars/.hadoop-build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cp -r "$SRC/pom.xml" "$SRC/src" "$WORK/"

step="mvn package dependency:copy-dependencies (Maven Central)"
# (Maven 3.8 prints colour resets even when quiet: strip them.)
mvn -q -B -Dstyle.color=never -f "$WORK/pom.xml" -Dmaven.repo.local="$CACHE/m2" \
  -DincludeScope=runtime -DoutputDirectory="$WORK/out" \
  package dependency:copy-dependencies 2>&1 | sed 's/\x1b\[[0-9;]*m//g'


step="installing into $DEST"
cp "$WORK/target/primus-minicluster.jar" "$WORK/out/"
echo "$STAMP_TEXT" >"$WORK/out/.stamp"
rm -rf "$DEST"
mv "$WORK/out" "$DEST"
echo "fetch-hadoop: $(ls "$DEST" | wc -l) jars in $DEST"
