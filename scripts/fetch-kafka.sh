#!/usr/bin/env bash
# Fetch Apache Kafka (KRaft: a combined broker + controller, no ZooKeeper) from Maven Central
# into $CACHE/jars/kafka-<version>, once. The jars are the dependencies of infra/kafka/pom.xml;
# devstack/kafka.py (the demo and the tests) runs them with `java -cp "$CACHE/jars/kafka-<version>/*" kafka.Kafka`.
# A complete cached copy (its stamp file) makes this a no-op in well under a second.
#
#   CACHE=$HOME/.cache/primus bash scripts/fetch-kafka.sh
#
# Needs Java 17+ and Maven (in the image), and Maven Central for the first fetch (~55 MB).
set -euo pipefail
step="start"
trap 'echo "fetch-kafka: FAILED during: $step (exit $?)" >&2' ERR

cd "$(dirname "$0")/.."
CACHE=${CACHE:-$HOME/.cache/primus}
POM=infra/kafka/pom.xml

step="reading the Kafka version from $POM"
VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")
[ -n "$VERSION" ]
DEST="$CACHE/jars/kafka-$VERSION"
STAMP="$DEST/.complete"
# The stamp holds the pom's checksum, so editing the pom (other jars) fetches again.
POM_SUM=$(sha256sum "$POM" | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" = "$POM_SUM" ]; then
  exit 0
fi

step="checking tools (java, mvn)"
for tool in java mvn; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fetch-kafka: '$tool' is missing (OpenJDK 17 and Maven are expected in the image)" >&2
    false
  fi
done

step="downloading kafka $VERSION and its dependencies from Maven Central"
mkdir -p "$CACHE/jars"
TMP=$(mktemp -d "$CACHE/jars/.kafka-$VERSION.XXXXXX")
cleanup() { rm -rf "$TMP"; }
trap cleanup EXIT
if ! mvn -q -B -f "$POM" -Dmaven.repo.local="$CACHE/m2" dependency:copy-dependencies \
  -DoutputDirectory="$TMP/jars" >"$TMP/mvn.log" 2>&1; then
  tail -n 40 "$TMP/mvn.log" >&2
  false
fi

step="checking the fetched jars"
ls "$TMP/jars/kafka_2.13-$VERSION.jar" "$TMP/jars/kafka-tools-$VERSION.jar" >/dev/null

step="moving the jars into $DEST"
echo "$POM_SUM" >"$TMP/jars/.complete"
rm -rf "$DEST"
mv "$TMP/jars" "$DEST"
echo "fetch-kafka: Apache Kafka $VERSION in $DEST"
