#!/usr/bin/env bash
# Install PostgreSQL 15 and the wal2json logical decoding plugin from Debian's packages.
# Idempotent: does nothing when both are already installed. Needs root (CI runs as root).
set -euo pipefail

PKGS=(postgresql-15 postgresql-15-wal2json)
missing=()
for pkg in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "postgres: ${PKGS[*]} already installed"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "postgres: installed ${missing[*]}"
