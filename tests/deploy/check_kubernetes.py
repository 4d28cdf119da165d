#!/usr/bin/env python3
"""Checks the Kubernetes manifests as the cluster would see them.

Renders deploy/kubernetes/base and the overlays (tls, monitoring, external) with `kubectl
kustomize` (when kubectl is installed; else reads the base files and skips the overlays, saying
so) and checks what an operator relies on: probes on the plaintext health-only port that rematd
is told to open, also under TLS; the worker's metrics and health ports with liveness apart from
readiness; no Prometheus Operator kind in the base (it applies on any cluster), the monitors of
the monitoring overlay selecting what they scrape; the external overlay exposing only gRPC; restricted Pod Security on the namespace and pod/container security contexts that
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
WORKER_METRICS_PORT, WORKER_HEALTH_PORT = 9465, 8082
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
    wc = wpod["containers"][0]
    wargs = wc["args"]
    check(flag(wargs, "--coordinator") == f"rematd.remat.svc:{GRPC_PORT}", "worker coordinator")
    check((flag(wargs, "--tls-ca") is not None) == tls, f"worker TLS flags present={tls}")
    check(flag(wargs, "--metrics-listen") == f"0.0.0.0:{WORKER_METRICS_PORT}",
          "worker --metrics-listen on 9465")
    check(flag(wargs, "--health-listen") == f"0.0.0.0:{WORKER_HEALTH_PORT}",
          "worker --health-listen on 8082")
    wports = {p["name"]: p["containerPort"] for p in wc.get("ports", [])}
    check(wports == {"metrics": WORKER_METRICS_PORT, "health": WORKER_HEALTH_PORT},
          f"worker ports {wports}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check(wc.get(probe, {}).get("grpc", {}).get("port") == WORKER_HEALTH_PORT,
              f"worker {probe} on its health port")
    # Liveness must not depend on the coordinator; readiness does (registered).
    check(wc.get("livenessProbe", {}).get("grpc", {}).get("service", "") == "",
          "worker liveness asks the overall status")
    check(wc.get("readinessProbe", {}).get("grpc", {}).get("service") == "remat.v1.WorkerService",
          "worker readiness asks remat.v1.WorkerService")
    # The base applies on any cluster: no Prometheus Operator kinds in it.
    check(not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")],
          "no Prometheus Operator objects outside overlays/monitoring")


def check_monitoring(docs):
    (sm,) = by_kind(docs, "ServiceMonitor")
    (svc,) = [d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "rematd"]
    check(sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items(),
          "ServiceMonitor selects the rematd Service")
    check([e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"], "ServiceMonitor port")
    check(any(p["name"] == "metrics" for p in svc["spec"]["ports"]), "Service names metrics")
    (pm,) = by_kind(docs, "PodMonitor")
    (ds,) = by_kind(docs, "DaemonSet")
    check(pm["spec"]["selector"]["matchLabels"].items() <=
          ds["spec"]["template"]["metadata"]["labels"].items(), "PodMonitor selects the workers")
    check([e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"],
          "PodMonitor port")
    for m in (sm, pm):
        check(m["spec"].get("jobLabel") == "app.kubernetes.io/name",
              f"{m['kind']}: job named after the app (rematd, remat-worker)")


def check_external(docs):
    ext = [d for d in by_kind(docs, "Service") if d["spec"].get("type") in
           ("LoadBalancer", "NodePort")]
    check(len(ext) == 1, "overlays/external adds one LoadBalancer or NodePort Service")
    if ext:
        (dep,) = by_kind(docs, "Deployment")
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        check(ext[0]["spec"]["selector"].items() <= pod_labels.items(),
              "the external Service selects rematd's pods")
        check([p["targetPort"] for p in ext[0]["spec"]["ports"]] == ["grpc"],
              "the external Service exposes the gRPC port only")


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
    check_monitoring(render(os.path.join(kdir, "overlays", "monitoring")))
    check_external(render(os.path.join(kdir, "overlays", "external")))
else:
    print("check_kubernetes: kubectl not installed: the overlays were not rendered")
for p in problems:
    print("check_kubernetes: FAILED:", p)
print("check_kubernetes:", "ok" if not problems else f"{len(problems)} problems")
sys.exit(1 if problems else 0)
