"""The README's InferenceService reference is the CRD's: its field table is generated from the committed
schema (`python tests/test_readme_crd.py` prints it, `--write` puts it in the README), every `spec.` path
the README and docs/*.md name exists, its example is admitted as written, and what it says the operator
takes for spec.quantization is what the webhook admits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CRD = ROOT / "crds" / "inferenceservices.serving.flotilla.dev.yaml"
# Objects and lists of Kubernetes' own types (or the model's config.json numbers): one row, their fields named.
COLLAPSED = {"spec.model.config", "spec.speculative.draftConfig", "spec.resources.tolerations", "spec.pod.env",
             "spec.pod.envFrom"}


def spec_schema() -> dict[str, Any]:
    """The committed CRD's schema of `spec` (tests/operator/test_crd.py keeps it the generated one)."""
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _type(s: dict[str, Any]) -> str:
    if s.get("x-kubernetes-int-or-string"):
        return "int or string"
    if s.get("type") == "array":
        return f"list of {_type(s.get('items', {}))}"
    if s.get("type") == "object" and "additionalProperties" in s:
        return f"map of {_type(s['additionalProperties'])}"
    return {"integer": "int", "number": "float", "boolean": "bool", "string": "string"}.get(s.get("type", ""),
                                                                                          s.get("type", "object"))


def _pattern(pattern: str) -> str:
    """A pattern in words where it is one of the schema's long ones, else as written."""
    if "pvc://" in pattern:
        forms = "`pvc://claim/path`, `hostPath:///path`, " + (
            "`hf://org/name[:revision]`" if "hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(:" in pattern
            else "`hf://org/name`")
        return forms + (" or one `.gguf` file of these" if "gguf" in pattern else "")
    if pattern.startswith("^([-_a-zA-Z0-9][-._a-zA-Z0-9]*"):
        return "a Secret or ConfigMap key (letters, digits, `-`, `_`, `.`)"
    if "[numkMGTPE]" in pattern:
        return "a quantity (`8Gi`)"
    if pattern.startswith("^[a-z0-9]([-a-z0-9]*[a-z0-9])?"):
        return "a DNS-1123 " + ("subdomain" if "\\." in pattern else "label")
    if pattern.startswith("^https?://"):
        return "an http(s) URL"
    if pattern.startswith("^(([A-Za-z0-9]"):
        return "a label value"
    return f"`{pattern}`"


def _allowed(s: dict[str, Any], collapsed: bool) -> str:
    if "pattern" in s:
        return _pattern(s["pattern"])
    if "enum" in s:
        return ", ".join(f"`{v}`" for v in s["enum"])
    if "minimum" in s and "maximum" in s:
        return f"{s['minimum']} to {s['maximum']}"
    if "minimum" in s:
        return f"at least {s['minimum']}"
    if collapsed:
        fields = s.get("properties") or s.get("items", {}).get("properties", {})
        required = set(s.get("required") or s.get("items", {}).get("required", []))
        return "fields " + ", ".join(f"`{k}`" + (" (required)" if k in required else "") for k in fields)
    return ""


def fields(s: dict[str, Any] | None = None, path: str = "spec") -> list[tuple[str, dict[str, Any], bool]]:
    """Every field of `spec`, depth first: (path, schema, required); list items' fields as `path[].name`."""
    s = s if s is not None else spec_schema()
    out = []
    for name, sub in s.get("properties", {}).items():
        here = f"{path}.{name}"
        out.append((here, sub, name in s.get("required", [])))
        if here in COLLAPSED:
            continue
        if "properties" in sub:
            out += fields(sub, here)
        elif "properties" in sub.get("items", {}):
            out += fields(sub["items"], here + "[]")
    return out


def crd_table() -> str:
    """The README's field table: path, type, default (or required), allowed values."""
    lines = ["| field | type | default | allowed |", "|---|---|---|---|"]
    for path, s, required in fields():
        value = s.get("default", {})
        default = ("required" if required else "" if value == {}
                   else f"`{value if isinstance(value, str) else json.dumps(value)}`")
        allowed = _allowed(s, path in COLLAPSED).replace("|", "\\|")  # a pipe would end the cell
        lines.append(f"| `{path}` | {_type(s)} | {default} | {allowed} |")
    return "\n".join(lines)


def named_paths(text: str) -> set[str]:
    """`spec.a.b` and `spec.a.{b, c}` paths in a text (list items written `spec.a[].b`)."""
    paths = set()
    for path, braces in re.findall(r"(?<![\w.])spec((?:\.[A-Za-z]\w*(?:\[\])?)+)(?:\.\{([\w, ]+)\})?", text):
        paths.add("spec" + path)
        paths |= {f"spec{path}.{leaf.strip()}" for leaf in braces.split(",") if braces}
    return paths


def _with_table(readme: str) -> str:
    """The README with its field table replaced by the CRD's."""
    head, rest = readme.split("<!-- crd:begin -->\n")
    return f"{head}<!-- crd:begin -->\n{crd_table()}\n<!-- crd:end -->{rest.split(chr(10) + '<!-- crd:end -->')[1]}"


def test_the_field_table_is_the_crds():
    assert _with_table(README) == README, "the CRD changed: run `python tests/test_readme_crd.py --write`"


def test_every_spec_path_the_readme_and_docs_name_exists():
    known = {path for path, _, _ in fields()}
    for path, s, _ in fields():  # a collapsed object's own fields, named in prose
        for name in s.get("properties", {}):
            known.add(f"{path}.{name}")
    problems = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "charts" / "flotilla" / "README.md"]:
        problems += [f"{doc.relative_to(ROOT)}: {p}" for p in sorted(named_paths(doc.read_text()) - known)]
    assert problems == []


def _example() -> dict[str, Any]:
    section = README.split("\n## InferenceService reference\n")[1].split("\n## ")[0]
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))


def test_the_readme_example_is_admitted_as_written():
    from flotilla.operator.admission import review

    example = _example()
    result = review(example["spec"], example["metadata"]["name"])
    assert (result.errors, result.warnings) == ([], [])


def test_the_readme_examples_comments_are_what_the_pods_get():
    """`apiKeySecretRef` becomes VLLM_API_KEY, engineArgs reach the engine, the GPU product is the node label,
    the rollout replaces pods one at a time, adapters are served under their names."""
    from flotilla.operator.admission import review
    from flotilla.operator.deployment import build_deployment

    example = _example()
    deployment = build_deployment(review(example["spec"], "llama-8b").spec, "llama-8b", "ns")
    pod = deployment["spec"]["template"]["spec"]
    engine = pod["containers"][0]
    env = {e["name"]: e for e in engine["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "llm-key", "key": "token"}}
    assert "HF_TOKEN" in env and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert engine["args"][-3:] == ["--enforce-eager", "--shutdown-timeout", "120"]
    assert "sql=/adapters/sql" in engine["args"] and engine["args"][engine["args"].index("--max-loras") + 1] == "8"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_the_quantizations_the_readme_says_the_operator_takes_are_what_it_admits():
    from flotilla.operator.admission import review

    said = re.search(r"`spec.quantization` takes (.*?) \(", README).group(1)
    takes = set(re.findall(r"`([\w-]+)`", said))
    enum = next(s["enum"] for path, s, _ in fields() if path == "spec.quantization")
    admitted = set()
    for value in enum:
        source = "pvc://models/m.gguf" if value == "gguf" else "pvc://models/m"
        if not review({"model": {"source": source}, "quantization": value}, "x").errors:
            admitted.add(value)
    assert takes == admitted


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print the README's InferenceService field table.")
    parser.add_argument("--write", action="store_true", help="rewrite the README's table in place")
    if parser.parse_args().write:
        (ROOT / "README.md").write_text(_with_table(README))
    else:
        print(crd_table())


def test_the_webhook_messages_docs_operator_quotes_are_the_webhooks():
    """docs/operator.md's "Admission webhook" table quotes messages; these specs produce them verbatim."""
    from flotilla.operator.admission import review

    table = (ROOT / "docs" / "operator.md").read_text().split("\n## Admission webhook\n")[1].split("\n## ")[0]
    specs = [{"monitoring": {"interval": "1ms"}}, {"autoscaling": {"maxReplicas": 2, "window": "99999999m"}},
             {"autoscaling": {"maxReplicas": 2, "prometheusAddress": "http://10.0.0.1:9090"}},
             {"engineArgs": ["--swap-space", "4"]}, {"engineArgs": ["--max-model-len", "5"]},
             {"engineArgs": ["--port", "1"]}, {"engineArgs": ["--shutdown-timeout=-5"]},
             {"kvCache": {"dtype": "fp8"}, "dtype": "float32"},
             {"pod": {"env": [{"name": "HF_HUB_OFFLINE", "value": "0"}]}}]
    for extra in specs:
        errors = review({"model": {"source": "pvc://models/x"}, **extra}, "x").errors
        assert len(errors) == 1 and f"`{errors[0]}`" in table, errors


def test_captured_kubectl_get_fis_columns_are_the_crds_printer_columns():
    """The `kubectl get fis` captures in docs/*.md show the CRD's printer columns, in order."""
    crd = yaml.safe_load(CRD.read_text())
    columns = ["NAME", *(c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"])]
    headers = [line for doc in sorted((ROOT / "docs").glob("*.md")) for line in doc.read_text().splitlines()
               if line.startswith("NAME ") and "REPLICAS" in line and "MODEL" in line]
    assert len(headers) >= 2
    for header in headers:
        assert re.split(r" {2,}", header.strip()) == columns, header
