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

# The services' packages carry their maintainer scripts, for their own unit: postinst creates
# the user, reloads systemd and restarts a running service on upgrade; prerm stops it on
# removal; postrm forgets it. Their /etc files are conffiles.
for p in rematd remat-worker; do
  for script in postinst prerm postrm; do
    dpkg-deb -I "$(pkg $p)" $script >"$work/$p.$script" || fail "$p has no $script"
    sh -n "$work/$p.$script" || fail "$p's $script is not valid sh"
    ! grep -q "@UNIT@" "$work/$p.$script" || fail "$p's $script names no unit"
  done
  grep -q "daemon-reload" "$work/$p.postinst" || fail "$p's postinst does not reload systemd"
  grep -q "try-restart $p.service" "$work/$p.postinst" || fail "$p's postinst does not restart $p.service on upgrade"
  grep -q "stop $p.service" "$work/$p.prerm" || fail "$p's prerm does not stop $p.service"
  grep -q "daemon-reload" "$work/$p.postrm" || fail "$p's postrm does not reload systemd"
  dpkg-deb -I "$(pkg $p)" conffiles | grep -q "^/etc/default/" || fail "$p has no conffiles"
done
# Every package has a copyright file and a description of its own.
descriptions=""
for deb in "$work"/out/*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  dpkg-deb -c "$deb" | awk '{print $6}' | grep -qx "./usr/share/doc/$name/copyright" ||
    fail "$name has no /usr/share/doc/$name/copyright"
  descriptions+="$(dpkg-deb -f "$deb" Description | head -1)"$'\n'
done
[ "$(sort <<<"$descriptions" | uniq -d | grep -c .)" = 0 ] || fail "packages share a description: $descriptions"
# The CLI package holds the CLI alone (no daemons pulled onto a laptop).
[ "$(dpkg-deb -c "$(pkg remat)" | awk '{print $6}' | grep -c '^\./usr/bin/.')" = 1 ] ||
  fail "remat holds more than the CLI"

# Unpack everything into one root and let systemd check the units as installed.
root="$work/root"
for deb in "$work"/out/*.deb; do dpkg-deb -x "$deb" "$root"; done
# Every program answers --version with exit 0 (a packaged binary that runs at all).
for prog in remat rematd remat-worker remat-trial; do
  [ -x "$root/usr/bin/$prog" ] || continue
  "$root/usr/bin/$prog" --version >"$work/version.out" 2>&1 || { cat "$work/version.out" >&2; fail "$prog --version failed"; }
  grep -q "[0-9]\.[0-9]" "$work/version.out" || fail "$prog --version printed no version"
done
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
