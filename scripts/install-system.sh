#!/usr/bin/env bash
# System packages the project needs: Kerberos headers (to build the HDFS provider's gssapi/krb5),
# Prometheus + Pushgateway (metrics tests), Go + etcd + dpkg-dev (to build and run a real kube-apiserver).
set -euo pipefail
want=(libkrb5-dev prometheus prometheus-pushgateway golang-go etcd-server etcd-client dpkg-dev)
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
