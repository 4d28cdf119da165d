"""What the systemd units promise an operator, checked on the files:

- remat-worker.service opens the GPUs of every NVIDIA driver generation: each character-device
  group the driver registers in /proc/devices is matched by a DeviceAllow=char-PATTERN line
  (systemd matches PATTERN with fnmatch against the names there), and nothing else is allowed.
  The names: NVIDIA/open-gpu-kernel-modules kernel-open/nvidia/nv.c (commit 01db2841111)
  registers major 195 as "nvidia" (GPUs) and "nvidiactl" (control); the closed drivers before the
  open modules registered it as "nvidia-frontend"; the other groups are the UVM, capability,
  IMEX-channel, NVLink and NVSwitch drivers of the same tree. A worker unit that allowed only
  "nvidia-frontend" and "nvidiactl" could not open /dev/nvidia0 under driver 580.
- Both units refuse to restart on exit 2 (bad configuration); rematd reloads on SIGHUP.

Usage: check_units.py SOURCE_DIR
"""

import fnmatch
import sys

DRIVER_GROUPS = [
    "nvidia", "nvidiactl", "nvidia-frontend", "nvidia-uvm", "nvidia-caps",
    "nvidia-caps-imex-channels", "nvidia-nvlink", "nvidia-nvswitch",
]
# Groups the worker must not get: /proc/devices names of other hardware.
FOREIGN_GROUPS = ["mem", "tty", "sg", "fb", "drm", "kvm", "usb", "hidraw", "rtc", "nvme"]


def settings(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith(("#", ";", "[")) or "=" not in line:
                continue
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def main():
    src = sys.argv[1]
    errors = []
    worker = settings(src + "/deploy/systemd/remat-worker.service")
    rematd = settings(src + "/deploy/systemd/rematd.service")

    patterns = []
    for value in worker.get("DeviceAllow", []):
        spec, _, access = value.partition(" ")
        if not spec.startswith("char-"):
            errors.append("remat-worker.service: DeviceAllow=%s is not a char- group" % value)
            continue
        if access != "rw":
            errors.append("remat-worker.service: DeviceAllow=%s: access should be rw" % value)
        patterns.append(spec[len("char-"):])
    if worker.get("DevicePolicy") != ["closed"]:
        errors.append("remat-worker.service: DevicePolicy must be closed")
    for group in DRIVER_GROUPS:
        if not any(fnmatch.fnmatchcase(group, p) for p in patterns):
            errors.append("remat-worker.service: no DeviceAllow matches /proc/devices group %r"
                          % group)
    for group in FOREIGN_GROUPS:
        if any(fnmatch.fnmatchcase(group, p) for p in patterns):
            errors.append("remat-worker.service: DeviceAllow lets in %r" % group)

    for name, unit in (("rematd.service", rematd), ("remat-worker.service", worker)):
        if "2" not in " ".join(unit.get("RestartPreventExitStatus", [])).split():
            errors.append("%s: RestartPreventExitStatus must name 2 (bad configuration)" % name)
    if not any("-HUP" in v for v in rematd.get("ExecReload", [])):
        errors.append("rematd.service: ExecReload must send SIGHUP (reloads the token files)")

    for e in errors:
        print("check_units: " + e, file=sys.stderr)
    if errors:
        return 1
    print("check_units: ok (%d device groups, %d DeviceAllow lines)" % (len(DRIVER_GROUPS),
                                                                         len(patterns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
