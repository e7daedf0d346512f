#!/usr/bin/env bash
# Tools the multi-host test needs: ip and tc (iproute2), iptables. Installs what is missing with
# apt-get when run as root; otherwise says what is missing and leaves it to the test to skip.
set -euo pipefail
missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v tc >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "multihost setup: missing ${missing[*]} (needs root and apt-get to install); the test will skip"
  exit 0
fi
echo "multihost setup: installing ${missing[*]}"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
