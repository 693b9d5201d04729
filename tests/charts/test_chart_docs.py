"""The docs' account of the chart is the chart's: docs/helm.md's values table has values.yaml's defaults,
every value a doc names exists, docs/observability.md's defaults are the chart's, and the README's quick start
names a chart, a sample and a short name that exist (tests/charts/test_chart_render.py checks the other way:
every value has a row)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "flotilla"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), CHART / "README.md",
        CHART / "templates" / "NOTES.txt"]
MISSING = object()


def value(path: str) -> Any:
    """values.yaml's value at a dotted path (MISSING if there is none)."""
    node: Any = VALUES
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return MISSING
        node = node[key]
    return node


def test_the_values_table_has_the_charts_defaults():
    table = (REPO / "docs" / "helm.md").read_text().split("\n## Values\n")[1]
    rows = re.findall(r"^\| `([\w.]+)` \| `(.*?)` \|", table, re.M)
    assert len(rows) > 40
    wrong = [(path, shown, value(path)) for path, shown in rows if yaml.safe_load(shown) != value(path)]
    assert wrong == []


def test_every_value_a_doc_names_exists():
    """`operator.watchNamespaces`, `--set prometheusAdapter.rules.enabled=true`, ... in any doc."""
    tops = "|".join(k for k, v in VALUES.items() if isinstance(v, dict))
    named = re.compile(rf"(?<![\w./-])((?:{tops})(?:\.[A-Za-z]\w*)+)")
    unknown = [f"{doc.relative_to(REPO)}: {path}" for doc in DOCS
               for path in sorted(set(named.findall(doc.read_text()))) if value(path) is MISSING]
    assert unknown == []


def test_observability_values_and_defaults_are_documented():
    """docs/observability.md names each `observability.*` value (a row's later ones as `.labels`) with its
    default where it states one."""
    text = (REPO / "docs" / "observability.md").read_text()
    for block, settings in VALUES["observability"].items():
        row = next(line for line in text.splitlines() if f"`observability.{block}." in line)
        for key, default in settings.items():
            path = f"observability.{block}.{key}"
            assert f"`{path}`" in row or f"`.{key}`" in row, path
            stated = re.search(rf"`\.?(?:observability\.{block}\.)?{key}` \(default (?:`([^`]+)`|([^\s,:;)]+))", row)
            if stated:
                shown = stated.group(1) or stated.group(2)
                assert yaml.safe_load(f"{{{shown}}}" if ":" in shown else shown) == default, (path, shown)


def test_the_readme_quick_start_names_what_exists():
    block = re.search(r"## Quick start on Kubernetes\n\n```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    commands = [line.split("#")[0].split() for line in block.group(1).splitlines()]
    helm = next(c for c in commands if c[:2] == ["helm", "install"])
    assert (REPO / helm[3] / "Chart.yaml").is_file()
    assert (REPO / helm[3] / "crds" / "inferenceservices.serving.flotilla.dev.yaml").is_file()  # Helm installs it
    sample = next(c for c in commands if c[:2] == ["kubectl", "apply"])[-1]
    manifest = yaml.safe_load((REPO / sample).read_text())
    assert manifest["kind"] == "InferenceService"
    assert f"named {manifest['metadata']['name']}" in block.group(1)
    crd = yaml.safe_load((REPO / "crds" / "inferenceservices.serving.flotilla.dev.yaml").read_text())
    assert next(c for c in commands if c[:2] == ["kubectl", "get"])[2] in crd["spec"]["names"]["shortNames"]


def test_the_dashboard_panels_and_variables_are_the_docs():
    """docs/observability.md's panel list: *panel* and **row or variable** titles are the dashboard's, and the
    SLO variables' defaults are what it says."""
    import json

    board = json.loads((CHART / "dashboards" / "flotilla.json").read_text())
    text = (REPO / "docs" / "observability.md").read_text().split("\n## Dashboard panels\n")[1].split("\n## ")[0]
    panels = {p["title"] for p in board["panels"] if p.get("type") != "row"}
    bold = {p["title"] for p in board["panels"] if p.get("type") == "row"}
    bold |= {v["label"] for v in board["templating"]["list"]}
    assert set(re.findall(r"(?<![*\w])\*([^*\n]+)\*(?!\*)", text)) - {"All"} == panels
    assert set(re.findall(r"\*\*([^*\n]+)\*\*", text)) == bold
    stated = {v["label"]: re.search(rf"\*\*{re.escape(v['label'])}\*\* \(default ([\d.]+)\)", text)
              for v in board["templating"]["list"]}
    defaults = {label: m.group(1) for label, m in stated.items() if m}
    assert len(defaults) == 2
    current = {v["label"]: v["current"].get("value") for v in board["templating"]["list"]}
    assert defaults == {label: current[label] for label in defaults}


def test_the_captured_install_notes_are_what_the_chart_prints(render):
    """docs/helm.md's `helm install` capture: its NOTES are the chart's, for release flotilla in namespace
    flotilla."""
    _, notes = render(name="flotilla", namespace="flotilla")
    captured = (REPO / "docs" / "helm.md").read_text().split("\nNOTES:\n")[1].split("```")[0]
    assert captured.strip() == notes.strip()


def test_what_the_chart_installs_is_the_rendered_objects(render):
    """docs/helm.md's "What the chart installs" table (release flotilla, every optional object on) is the
    rendered objects' kinds and names, plus the CRD from crds/."""
    objects, _ = render({"prometheusAdapter": {"rules": {"enabled": True}},
                         "observability": {"prometheusRule": {"enabled": True}}}, name="flotilla", namespace="flotilla")
    text = (REPO / "docs" / "helm.md").read_text().split("\n## What the chart installs\n")[1].split("\n## ")[0]
    documented = set()
    for kinds, names in re.findall(r"^\| ([A-Z][\w/, ]+) \| ((?:`[^`]+`(?:, )?)+) \|", text, re.M):
        kinds = [k for kind in kinds.split(", ") for k in (
            [f"{p}WebhookConfiguration" for p in kind.removesuffix("WebhookConfiguration").split("/")]
            if "/" in kind else [kind])]
        names = re.findall(r"`([^`]+)`", names)
        if len(names) == 1:
            names = names * len(kinds)
        documented |= set(zip(kinds, names, strict=True))
    rendered = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert documented == rendered | {("CustomResourceDefinition", "inferenceservices.serving.flotilla.dev")}


def _grants(objects: list[dict[str, Any]], kind: str) -> set[tuple[str, str, str]]:
    return {(group, resource, ", ".join(rule["verbs"])) for o in objects if o["kind"] == kind
            for rule in o["rules"] for group in rule["apiGroups"] for resource in rule["resources"]}


def test_the_rbac_table_is_the_charts_roles(render):
    """docs/helm.md's RBAC table is the ClusterRole's rules (the namespaces row only with watchNamespaces), and
    with plain watched names every row but the last two is a Role's."""
    text = (REPO / "docs" / "helm.md").read_text().split("\n## RBAC\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| ([\w.\"]+) \| ([\w/]+) \| ([a-z, ]+) \|", text, re.M)
    table = [(group.strip('"'), resource, verbs) for group, resource, verbs in rows]
    objects, _ = render({}, name="flotilla", namespace="flotilla")
    assert set(table) == _grants(objects, "ClusterRole") | {("", "namespaces", "list, watch")}
    assert "every rule above but the last two is a **Role**" in text
    namespaced, _ = render({"operator": {"watchNamespaces": ["a"]}}, name="flotilla", namespace="flotilla")
    assert _grants(namespaced, "Role") == set(table[:-2])
    assert _grants(namespaced, "ClusterRole") == set(table[-2:])


def test_each_value_reaches_the_operator_flag_its_row_names(render):
    """A values row that names an operator flag (`--serving-period`, ...): setting the value puts it on that flag of
    the operator's container."""
    samples = {"operator.hostPath.allowedPrefixes": ["/models"],
               "operator.engineAnnotations.allowed": ["prometheus.io/"],
               "operator.engineLabels.allowed": ["example.com/team"], "operator.priorityClasses.allowed": ["inference"],
               "operator.serviceAccounts.allowed": ["model-reader"],
               "operator.keda.prometheusAddresses": ["http://prom.monitoring.svc:9090"], "operator.logLevel": "debug"}
    table = (REPO / "docs" / "helm.md").read_text().split("\n## Values\n")[1]
    rows = re.findall(r"^\| `([\w.]+)` \| `.*?` \| .*?(--[a-z][\w-]+)", table, re.M)
    assert len(rows) >= 10
    for path, flag in rows:
        default = value(path)
        new = samples.get(path, default + 1 if isinstance(default, int) else None)
        assert new is not None, path
        overrides: dict[str, Any] = {}
        node = overrides
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = new
        objects, _ = render(overrides, name="flotilla", namespace="flotilla")
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        if isinstance(new, list):
            wanted = {f"{flag}={v}" for v in new}
        else:
            wanted = {flag if new == "debug" else f"{flag}={new}"}
        assert wanted <= set(args), (path, flag, args)


def test_the_requirements_state_the_charts_kube_version():
    """docs/helm.md's Requirements quote Chart.yaml's kubeVersion (helm refuses an older cluster by it) and say what
    needs 1.21: the webhooks' namespaceSelector, which the template renders only from 1.21."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    requirements = (REPO / "docs" / "helm.md").read_text().split("\n## Requirements\n")[1].split("\n## ")[0]
    assert f'`kubeVersion: "{chart["kubeVersion"]}"`' in requirements
    assert "kubernetes.io/metadata.name" in requirements and "1.21" in requirements
    assert 'semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version' in (
        CHART / "templates" / "webhook.yaml").read_text()
