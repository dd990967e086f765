#!/usr/bin/env bash
# System packages the build needs, installed with apt-get where missing (root, Debian/Ubuntu).
# Usage: scripts/sysdeps.sh [extra packages...]
set -euo pipefail
need=(ccache "$@")
missing=()
for pkg in "${need[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "sysdeps: no apt-get here; install ${missing[*]} yourself (ccache is optional; the Vulkan plugin needs glslc and the Vulkan headers)" >&2
  exit 0
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "sysdeps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
