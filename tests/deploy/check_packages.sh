#!/usr/bin/env bash
# Builds the Debian packages from a configured, built tree and checks them as an operator would
# see them: the files each package holds, the unit files installed where systemd reads them
# (systemd-analyze verify on the unpacked tree), the maintainer script and the conffiles.
# Usage: check_packages.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_packages: $*" >&2; exit 1; }

(cd "$work" && cpack --config "$build/CPackConfig.cmake" -G DEB -B "$work/out" >"$work/cpack.log" 2>&1) ||
  { cat "$work/cpack.log" >&2; fail "cpack failed"; }

pkg() { ls "$work"/out/"$1"_*.deb 2>/dev/null | head -1; }
expect() {  # expect PACKAGE PATH...: each PATH is in the package
  local deb; deb=$(pkg "$1"); [ -n "$deb" ] || fail "package $1 was not built"; shift
  local listing; listing=$(dpkg-deb -c "$deb" | awk '{print $6}')
  for p in "$@"; do grep -qx "\.$p" <<<"$listing" || fail "$(basename "$deb") lacks $p"; done
}
expect remat /usr/bin/remat /usr/libexec/remat/prolog-remat-submit.sh
expect rematd /usr/bin/rematd /usr/lib/systemd/system/rematd.service /usr/lib/sysusers.d/remat.conf \
  /etc/default/rematd
expect remat-worker /usr/bin/remat-worker /usr/lib/systemd/system/remat-worker.service \
  /etc/default/remat-worker /usr/share/remat/megatron_bridge/remat_metrics_callback.py \
  /usr/share/remat/megatron_bridge/pretrain_with_remat.py \
  /usr/share/remat/megatron_bridge/command-templates.yaml \
  /usr/share/remat/megatron_driver/remat_megatron_driver.py
if [ -x "$build/bin/remat-trial" ]; then expect remat-engine /usr/bin/remat-trial; fi

# The services' packages carry the postinst that creates the user, and their /etc files as conffiles.
for p in rematd remat-worker; do
  dpkg-deb -I "$(pkg $p)" postinst >/dev/null || fail "$p has no postinst"
  dpkg-deb -I "$(pkg $p)" conffiles | grep -q "^/etc/default/" || fail "$p has no conffiles"
done
# The CLI package holds the CLI alone (no daemons pulled onto a laptop).
[ "$(dpkg-deb -c "$(pkg remat)" | awk '{print $6}' | grep -c '^\./usr/bin/.')" = 1 ] ||
  fail "remat holds more than the CLI"

# Unpack everything into one root and let systemd check the units as installed.
root="$work/root"
for deb in "$work"/out/*.deb; do dpkg-deb -x "$deb" "$root"; done
for unit in rematd remat-worker; do
  [ -x "$root/usr/bin/$unit" ] || fail "/usr/bin/$unit is not executable in the package"
  # verify resolves ExecStart against the real /usr/bin: point it at the unpacked binary.
  sed "s#/usr/bin/$unit#$root/usr/bin/$unit#" "$root/usr/lib/systemd/system/$unit.service" \
    >"$work/$unit.service"
  out=$(cd "$work" && systemd-analyze verify "./$unit.service" 2>&1) || { echo "$out" >&2; fail "$unit.service does not verify"; }
  if grep -v "Failed to \(read\|open\) .*/etc/default\|nvidia-persistenced" <<<"$out" | grep -q .; then
    echo "$out" >&2; fail "$unit.service: systemd-analyze verify printed warnings"
  fi
done
ls -l "$work"/out/*.deb | awk '{print $5, $9}' | sed "s#$work/out/##"
echo "check_packages: ok"
