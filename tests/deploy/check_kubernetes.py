#!/usr/bin/env python3
"""Checks the Kubernetes manifests as the cluster would see them.

Renders deploy/kubernetes/base and the TLS overlay with `kubectl kustomize` (when kubectl is
installed; else reads the base files and skips the overlay, saying so) and checks what an
operator relies on: probes on the plaintext health-only port that rematd is told to open, also
under TLS; restricted Pod Security on the namespace and pod/container security contexts that
satisfy it; resource requests and memory limits on every container; the default ports; with
VERSION (CMake's project version, the version's one source), that remat's images and the
app.kubernetes.io/version labels carry it.
Usage: check_kubernetes.py REPO_ROOT [VERSION]
"""
import os
import shutil
import subprocess
import sys

import yaml

GRPC_PORT, METRICS_PORT, HEALTH_PORT = 50051, 9464, 8081
problems = []


def check(cond, what):
    if not cond:
        problems.append(what)


def render(path):
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "kustomize", path], check=True, capture_output=True,
                             text=True).stdout
        return [d for d in yaml.safe_load_all(out) if d]
    docs = []
    kust = yaml.safe_load(open(os.path.join(path, "kustomization.yaml")))
    for res in kust["resources"]:
        docs += [d for d in yaml.safe_load_all(open(os.path.join(path, res))) if d]
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def flag(args, name):
    for a in args:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def check_pod(name, pod):
    psc = pod.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, f"{name}: pod runAsNonRoot")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
          f"{name}: pod seccompProfile RuntimeDefault")
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        check(sc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation false")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name}: drop ALL capabilities")
        check(sc.get("readOnlyRootFilesystem") is True, f"{name}: read-only root file system")
        res = c.get("resources", {})
        check("cpu" in res.get("requests", {}) and "memory" in res.get("requests", {}),
              f"{name}: cpu and memory requests")
        check("memory" in res.get("limits", {}), f"{name}: memory limit")


def check_layout(docs, tls):
    ns = by_kind(docs, "Namespace")
    check(len(ns) == 1 and ns[0]["metadata"].get("labels", {}).get(
        "pod-security.kubernetes.io/enforce") == "restricted", "namespace enforces restricted")
    (dep,) = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    check_pod("rematd", pod)
    c = pod["containers"][0]
    args = c["args"]
    check(flag(args, "--listen") == f"0.0.0.0:{GRPC_PORT}", "rematd --listen on 50051")
    check(flag(args, "--metrics-listen") == f"0.0.0.0:{METRICS_PORT}", "rematd metrics on 9464")
    check(flag(args, "--health-listen") == f"0.0.0.0:{HEALTH_PORT}", "rematd --health-listen 8081")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports == {"grpc": GRPC_PORT, "metrics": METRICS_PORT, "health": HEALTH_PORT},
          f"rematd ports {ports}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check(c.get(probe, {}).get("grpc", {}).get("port") == HEALTH_PORT,
              f"rematd {probe} on the plaintext health port")
    check((flag(args, "--tls-cert") is not None) == tls, f"rematd TLS flags present={tls}")
    (ds,) = by_kind(docs, "DaemonSet")
    wpod = ds["spec"]["template"]["spec"]
    check_pod("remat-worker", wpod)
    wargs = wpod["containers"][0]["args"]
    check(flag(wargs, "--coordinator") == f"rematd.remat.svc:{GRPC_PORT}", "worker coordinator")
    check((flag(wargs, "--tls-ca") is not None) == tls, f"worker TLS flags present={tls}")


def versions(node, found):
    """Every remat image tag and app.kubernetes.io/version label below `node`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "image" and isinstance(v, str) and v.startswith("remat/"):
                found.append((v, v.rsplit(":", 1)[-1]))
            elif k == "app.kubernetes.io/version":
                found.append((k, str(v)))
            else:
                versions(v, found)
    elif isinstance(node, list):
        for v in node:
            versions(v, found)
    return found


root = sys.argv[1]
kdir = os.path.join(root, "deploy", "kubernetes")
base = render(os.path.join(kdir, "base"))
check_layout(base, tls=False)
if len(sys.argv) > 2:
    found = versions(base, [])
    check(any(w.startswith("remat/") for w, _ in found), "remat images named in the manifests")
    for what, v in found:
        check(v == sys.argv[2], f"{what}: version {v}, CMake's project version is {sys.argv[2]}")
if shutil.which("kubectl"):
    check_layout(render(os.path.join(kdir, "overlays", "tls")), tls=True)
else:
    print("check_kubernetes: kubectl not installed: the TLS overlay was not rendered")
for p in problems:
    print("check_kubernetes: FAILED:", p)
print("check_kubernetes:", "ok" if not problems else f"{len(problems)} problems")
sys.exit(1 if problems else 0)
