#!/usr/bin/env bash
# System packages the project needs: Kerberos headers (to build the HDFS provider's gssapi/krb5),
# Prometheus + Pushgateway (metrics tests), Go + etcd + dpkg-dev (to build and run a real kube-apiserver).
set -euo pipefail
trap 'echo "install-system: FAILED (exit $?) while installing: ${missing[*]:-checking}" >&2' ERR
# postgresql-15: Airflow's metadata DB in the integration tests (preinstalled on the project's image).
# chromium: the headless browser of tests/airflow/test_browser.py (driven by playwright, no browser download).
# docker-compose: Compose's validator for docker-compose.yaml (tests/test_compose.py; no Docker engine needed).
want=(libkrb5-dev prometheus prometheus-pushgateway golang-go etcd-server etcd-client dpkg-dev postgresql-15 chromium docker-compose)
missing=()
for pkg in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing system packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Java 17 + Maven fetch the Kafka and Hadoop jars (scripts/fetch-*.sh); Go builds kwok.
for tool in java mvn; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install-system: '$tool' is missing (the project's machines carry Java 17 + Maven)" >&2; exit 1; }
done
