"""The dashboard and the alert rules query only metrics the programs export.

Every metric name in deploy/grafana/remat-dashboard.json's queries and in
deploy/prometheus/remat-alerts.yaml's expressions must be one the headers that build the
families declare (server/metrics.h for rematd, worker/worker_metrics.h for remat-worker, the
process_* series of common/process_metrics.h), with a histogram's _bucket/_count/_sum, or
Prometheus's own (up, scrape_*). A renamed metric then fails here instead of leaving an empty
panel or an alert that never fires. Panels must have unique ids and must not overlap.

Usage: check_metric_names.py SOURCE_DIR
"""

import json
import os
import re
import sys

PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
NAME = re.compile(r"\b((?:remat|process)_[a-z0-9_]+)")


def declared(src):
    names = set()
    for header in ("server/metrics.h", "worker/worker_metrics.h", "common/process_metrics.h"):
        with open(os.path.join(src, header)) as f:
            for line in f:
                if line.startswith("//"):
                    names.update(NAME.findall(line))
    out = set(names)
    for n in names:
        out.update({n + "_bucket", n + "_count", n + "_sum"})
    return out


def used(expr):
    found = set(NAME.findall(expr))
    found.update(w for w in re.findall(r"\b[a-z_]+\b", expr) if w in PROMETHEUS_OWN)
    return found


def main():
    src = sys.argv[1]
    known = declared(src) | PROMETHEUS_OWN
    errors = []
    with open(os.path.join(src, "deploy/grafana/remat-dashboard.json")) as f:
        dash = json.load(f)
    ids = set()
    cells = {}
    for p in dash["panels"]:
        if p["id"] in ids:
            errors.append("dashboard: panel id %d twice" % p["id"])
        ids.add(p["id"])
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    errors.append("dashboard: panels %r and %r overlap" % (cells[(x, y)], p["title"]))
                    break
                cells[(x, y)] = p["title"]
        for t in p.get("targets", []):
            for n in used(t["expr"]) - known:
                errors.append("dashboard: panel %r queries unknown metric %s" % (p["title"], n))
    for v in dash["templating"]["list"]:
        q = v.get("definition", "")
        for n in used(q) - known:
            errors.append("dashboard: variable %s queries unknown metric %s" % (v["name"], n))
    with open(os.path.join(src, "deploy/prometheus/remat-alerts.yaml")) as f:
        rules = f.read()
    for expr in re.findall(r"expr: (\|\n(?:\s{10}.*\n)+|.*)", rules):
        for n in used(expr) - known:
            errors.append("alerts: an expression uses unknown metric %s" % n)
    for e in sorted(set(errors)):
        print("check_metric_names: " + e, file=sys.stderr)
    if errors:
        return 1
    print("check_metric_names: ok (%d panels)" % len(dash["panels"]))
    return 0



if __name__ == "__main__":
    sys.exit(main())
