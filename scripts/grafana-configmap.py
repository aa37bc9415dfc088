#!/usr/bin/env python3
"""Write deploy/kubernetes/monitoring/grafana-dashboard.yaml: the Grafana dashboard
(deploy/grafana/strata-kernel-worker.json) as a ConfigMap for Grafana's dashboard sidecar.

Edit the JSON, then run ``python3 scripts/grafana-configmap.py``; a test checks that the
two agree (tests/system/test_dashboard.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "strata-kernel-worker.json"
CONFIGMAP = ROOT / "deploy" / "kubernetes" / "monitoring" / "grafana-dashboard.yaml"

HEADER = """\
# Made from deploy/grafana/strata-kernel-worker.json by scripts/grafana-configmap.py: edit
# the JSON, then run the script (a test checks that the two agree).
#
# Grafana's dashboard sidecar (the grafana Helm chart with sidecar.dashboards.enabled, as in
# kube-prometheus-stack) loads every ConfigMap labelled grafana_dashboard: "1"; it looks in
# its own namespace unless sidecar.dashboards.searchNamespace says otherwise. The dashboard
# asks for a Prometheus data source that scrapes the workers (monitoring/servicemonitor.yaml).
apiVersion: v1
kind: ConfigMap
metadata:
  name: strata-kernel-worker-dashboard
  labels:
    app: strata-kernel-worker
    app.kubernetes.io/name: strata-kernel-worker
    grafana_dashboard: "1"
data:
  strata-kernel-worker.json: |
"""


def configmap() -> str:
    text = json.dumps(json.loads(DASHBOARD.read_text()), indent=2)
    return HEADER + "".join(f"    {line}\n" for line in text.splitlines())


def main() -> int:
    CONFIGMAP.write_text(configmap())
    print(f"wrote {CONFIGMAP.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
