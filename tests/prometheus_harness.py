"""A real Prometheus (3.14.0, the release kube-prometheus-stack 88.5.3 runs, built by `triarch local build`) inside a
network namespace, running the configuration a real Prometheus Operator generated (`operator_config`), or scraping
targets a test writes; asked through a client inside the namespace, as KEDA and Grafana ask it."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine_tier import eventually
from triarch.local import engines
from triarch.local.inside import Client

KUBE_PROMETHEUS_STACK_SELECTOR = {"matchLabels": {"release": "kube-prometheus-stack"}}
"""What the Prometheus kube-prometheus-stack 88.5.3 renders selects monitors and rules by, for a release named
kube-prometheus-stack: its values' podMonitorSelectorNilUsesHelmValues, serviceMonitorSelectorNilUsesHelmValues and
ruleSelectorNilUsesHelmValues are true, so each selector is `release: <release name>` (templates/prometheus/
prometheus.yaml), in every namespace (the namespace selectors are empty)."""


def prometheus_resource(name: str, namespace: str) -> dict[str, Any]:
    """A Prometheus resource as kube-prometheus-stack's selects: what the operator generates the configuration of."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "podMonitorSelector": KUBE_PROMETHEUS_STACK_SELECTOR,
                     "podMonitorNamespaceSelector": {}, "serviceMonitorSelector": KUBE_PROMETHEUS_STACK_SELECTOR,
                     "serviceMonitorNamespaceSelector": {}, "ruleSelector": KUBE_PROMETHEUS_STACK_SELECTOR,
                     "ruleNamespaceSelector": {}}}


def operator_config(generated: dict[str, Any], kubeconfig: Path, pod: str, interval: str = "1s") -> dict[str, Any]:
    """The configuration a Prometheus Operator generated, for a Prometheus outside the cluster, as the operator's
    config-reloader hands it to Prometheus in the pod `pod` of shard 0: the `$(SHARD)` and `$(POD_NAME)` the
    operator leaves in it expanded from the reloader's environment (prometheus-operator v0.93.1
    pkg/operator/config_reloader.go, the reloader's --config-envsubst-file); each Kubernetes discovery reading
    `kubeconfig` (in a pod it reads its service account); every scrape each `interval` (the monitors' 15 s
    compressed, as alerts' `for` is held: a test cannot wait out production's intervals). Everything else (jobs,
    discovery roles and namespaces, relabelings) is the operator's."""
    environment = {"SHARD": "0", "POD_NAME": pod}
    text = re.sub(r"\$\((SHARD|POD_NAME)\)", lambda m: environment[m.group(1)], json.dumps(generated))
    assert "$(" not in text, f"a reloader variable not expanded here: {re.findall(r'[$][(][A-Z_]+[)]', text)}"
    config = json.loads(text)
    config.setdefault("global", {}).update(scrape_interval=interval, evaluation_interval=interval)
    config.pop("rule_files", None)  # paths inside the operator's pod
    for job in config.get("scrape_configs", []):
        job.update(scrape_interval=interval, scrape_timeout=interval)
        for discovery in job.get("kubernetes_sd_configs", []):
            discovery["kubeconfig_file"] = str(kubeconfig)
    return config


def generated_secret(secret: dict[str, Any]) -> dict[str, Any] | None:
    """The configuration in the Secret a Prometheus Operator writes for a Prometheus resource (prometheus-<name>,
    key prometheus.yaml.gz, gzipped YAML), or None before it wrote one."""
    import base64
    import gzip

    import yaml

    data = secret.get("data", {})
    if "prometheus.yaml.gz" not in data:
        return None
    loaded: dict[str, Any] = yaml.safe_load(gzip.decompress(base64.b64decode(data["prometheus.yaml.gz"])))
    return loaded


def write_atomically(path: Path, text: str) -> None:
    """Readers (Prometheus's file watch) see the old file or the new one, never half of one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


READY_TIMEOUT = 300
"""Seconds for Prometheus to answer /-/ready: under a second alone; on a fresh host's first run its start beside
Ray's five starting engines did not answer within 60 (2026-12-07, its log ending at its "operational information"
line), so the wait is long and its end says where Prometheus waited (a goroutine dump)."""


class Prometheus:
    """One Prometheus process: a file_sd job over `targets.json`, rule files, 1-second scrapes and evaluations."""

    def __init__(self, inside: Callable[[Sequence[str]], list[str]], client: Client, work: Path, port: int,
                 rules: list[Path] | None = None, interval: str = "1s",
                 config: dict[str, Any] | None = None) -> None:
        """With `config` (a Prometheus Operator's, `operator_config`), Prometheus discovers and scrapes what that
        configuration says; without, the targets `scrape` writes."""
        import yaml

        self.client, self.port, self.work = client, port, work
        work.mkdir(parents=True, exist_ok=True)
        self.targets = work / "targets.json"
        write_atomically(self.targets, "[]")
        if config is None:
            config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                      "rule_files": [str(r) for r in rules or []],
                      # honor_labels false, as the operator writes it for an endpoint that does not set honorLabels
                      "scrape_configs": [{"job_name": "podmonitors", "honor_labels": False,
                                          "file_sd_configs": [{"files": [str(self.targets)]}]}]}
        (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = work / "prometheus.log"
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(inside([
                str(engines.binary("prometheus")), f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]),
                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        settled = eventually(lambda: self.process.poll() is not None or self.get("/-/ready") is not None,
                             READY_TIMEOUT, 0.5)
        if settled and self.process.poll() is not None:
            raise AssertionError(f"Prometheus exited with code {self.process.poll()} before it was ready:\n"
                                 f"{self.log.read_text(errors='replace')[-3000:]}")
        if not settled:
            self.process.send_signal(signal.SIGQUIT)  # Go prints every goroutine's stack: where it waits
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            self.stop()
            log = self.log.read_text(errors="replace")
            main = log.find("goroutine 1 [")
            raise AssertionError(f"Prometheus is not ready within {READY_TIMEOUT}s:\n{log[:3000]}"
                                 + (f"\n...\n{log[main:main + 4000]}" if main >= 0 else ""))

    def scrape(self, groups: list[dict[str, Any]]) -> None:
        write_atomically(self.targets, json.dumps(groups))

    def get(self, path: str, **params: str) -> str | None:
        """Prometheus's answer to GET `path` (None if it does not answer, or not with 200)."""
        url = f"http://127.0.0.1:{self.port}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        answer = self.client.get(url, timeout=30)
        return answer.body if answer.status == 200 else None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector, as KEDA's prometheus scaler asks for it (GET /api/v1/query)."""
        body = self.get("/api/v1/query", query=promql)
        assert body is not None, f"Prometheus did not answer {promql}\n{self.log.read_text()[-2000:]}"
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def firing(self) -> set[str]:
        """The alerts firing now (Prometheus's own ALERTS series)."""
        return {s["metric"]["alertname"] for s in self.query('ALERTS{alertstate="firing"}')}

    def stop(self) -> None:
        """SIGTERM first: through sudo (the non-root way into the namespace) a SIGKILL ends sudo and leaves
        Prometheus running in the namespace; SIGTERM is passed on."""
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
