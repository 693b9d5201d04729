"""The README's metrics table is what the engine serves: names, types, labels and bucket ranges, both as the
metrics are built (every optional family on) and as the shared server's /metrics serves them; and every
`vllm:` name the docs, the chart's rules and the operator's readers use is one the engine serves."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
# Families only some servers export, and the flag that turns each on.
OPTIONAL = {"vllm:lora_requests_info": "--enable-lora", "vllm:spec_decode_num_drafts": "--speculative-config",
            "vllm:spec_decode_num_draft_tokens": "--speculative-config",
            "vllm:spec_decode_num_accepted_tokens": "--speculative-config",
            "vllm:spec_decode_num_accepted_tokens_per_pos": "--speculative-config"}
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


@dataclass
class Row:
    """One documented family: its type (None: "as vLLM"), its label set, its bucket range if stated."""

    type: str | None
    labels: frozenset[str]
    buckets: tuple[float, float] | None


def family(name: str, families: dict[str, Row]) -> str:
    """A sample or query name's family among `families`: `vllm:x_total` -> `vllm:x` (prometheus_client's
    family names), but `vllm:iteration_tokens_total` is a histogram's own name."""
    for suffix in SUFFIXES:
        if name not in families and name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def documented() -> dict[str, Row]:
    """The README's metrics table, family -> Row."""
    section = README.split("\n## Metrics\n")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `vllm:") or line.startswith("| names ")]
    table: dict[str, Row] = {}
    for line in rows:
        cell, kind = (c.strip() for c in line.strip("|").rsplit("|", 1))
        listed = re.search(r"\(labels: ([^;)]*)", cell)
        range_ = re.search(r"\(([\d.]+) … ([\d.]+) s\)", cell)
        for name, braces in re.findall(r"`(vllm:[\w:]+)(\{[^}]*\})?`", cell):
            labels = set(listed.group(1).split(", ")) if listed else {"model_name"}
            labels |= set(filter(None, braces.strip("{}").split(",")))
            table[name] = Row(None if kind == "as vLLM" else kind, frozenset(labels),
                                      (float(range_.group(1)), float(range_.group(2))) if range_ else None)
    return table


def served(text: str) -> dict[str, Row]:
    """An exposition, family -> Row (labels of its samples without `le`; the bucket range without +Inf)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        bounds = sorted(float(s.labels["le"]) for s in fam.samples if "le" in s.labels and s.labels["le"] != "+Inf")
        out[fam.name] = Row(fam.type, frozenset(labels), (bounds[0], bounds[-1]) if bounds else None)
    return out


def check(exposed: dict[str, Row], doc: dict[str, Row]) -> list[str]:
    """Every served family is a documented one with the documented type, labels and bucket range."""
    problems = []
    doc = {family(name, exposed): row for name, row in doc.items()}
    for name, got in sorted(exposed.items()):
        want = doc.get(name)
        if want is None:
            problems.append(f"{name} ({got.type}) is served but not in the README's metrics table")
            continue
        if want.type is not None and want.type != got.type:
            problems.append(f"{name}: the README says {want.type}, /metrics says {got.type}")
        if want.labels != got.labels:
            problems.append(f"{name}: the README's labels {sorted(want.labels)}, /metrics' {sorted(got.labels)}")
        if want.buckets is not None and want.buckets != got.buckets:
            problems.append(f"{name}: the README's buckets {want.buckets}, /metrics' {got.buckets}")
    return problems


@pytest.fixture(scope="module")
def every_family(tiny_model_dirs) -> dict[str, Row]:
    """The engine's metrics as built with LoRA and speculative decoding on, after one snapshot."""
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.server.metrics import EngineMetrics
    from flotilla.engine.stats import SpecDecodeCounts, StatsSnapshot

    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64, enable_lora=True,
                                      speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    metrics = EngineMetrics(config, "tiny")
    metrics.update(StatsSnapshot(num_gpu_blocks=8, spec_decode=SpecDecodeCounts(1, 2, 1, (1, 0))))
    return served(metrics.render().decode())


def test_every_family_the_engine_builds_is_documented_as_served(every_family):
    assert check(every_family, documented()) == []


def test_every_documented_family_is_built(every_family):
    assert sorted(name for name in documented() if family(name, every_family) not in every_family) == []


def test_the_shared_server_serves_the_documented_families(server):
    """The real server (no LoRA, no speculation): its /metrics is the table less the optional rows."""
    exposed = served(httpx.get(f"{server.url}/metrics", timeout=10).text)
    doc = documented()
    assert check(exposed, doc) == []
    assert sorted(family(name, exposed) for name in doc if family(name, exposed) not in exposed) == sorted(OPTIONAL)


def test_cache_config_info_carries_the_prefix_caching_hash_algo_as_vllm(server, tiny_model_dirs):
    """vLLM labels vllm:cache_config_info with its CacheConfig's fields, `prefix_caching_hash_algo` among them: the
    shared server's default (sha256) on its /metrics, and the configured one where it is set."""
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.server.metrics import EngineMetrics
    from flotilla.engine.stats import StatsSnapshot

    def info(text: str) -> dict[str, str]:
        (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info"]
        (sample,) = fam.samples
        return sample.labels

    assert info(httpx.get(f"{server.url}/metrics", timeout=10).text)["prefix_caching_hash_algo"] == "sha256"
    config = EngineConfig.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=64,
                                      prefix_caching_hash_algo="builtin")
    metrics = EngineMetrics(config, "tiny")
    metrics.update(StatsSnapshot(num_gpu_blocks=8))
    assert info(metrics.render().decode())["prefix_caching_hash_algo"] == "builtin"


def test_every_vllm_name_the_docs_rules_and_operator_use_is_served(every_family):
    """Names in the README, docs/*.md, the chart (rules, dashboard, values) and the operator's readers."""
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "operator").glob("*.py")),
               *sorted((ROOT / "charts" / "flotilla").rglob("*.yaml")),
               *sorted((ROOT / "charts" / "flotilla").rglob("*.json")), ROOT / "charts" / "flotilla" / "README.md"]
    unknown = set()
    for path in sources:
        for name in re.findall(r"vllm:[a-z0-9_]*[a-z0-9]", path.read_text()):
            if family(name, every_family) not in every_family:
                unknown.add(f"{path.relative_to(ROOT)}: {name}")
    assert sorted(unknown) == []


def test_token_count_buckets_are_one_two_five_up_to_max_model_len(every_family):
    """'(1-2-5 up to max_model_len)': the fixture's max_model_len is 64."""
    assert "(1-2-5 up to max_model_len)" in README
    for name in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert every_family[name].buckets == (1, 50), name


def test_what_the_operator_scales_and_reports_on_is_served_with_its_type(every_family):
    """The autoscaling metrics (spec.autoscaling.metric: a per-pod gauge `vllm:<metric>`, or a latency SLO
    over a histogram) and the status.serving reader's names exist with the type their queries assume."""
    from flotilla.operator import serving_metrics
    from flotilla.operator.autoscaling import SLO_HISTOGRAMS
    from flotilla.operator.spec import AutoscalingMetric

    for metric in typing.get_args(AutoscalingMetric):
        name = SLO_HISTOGRAMS.get(metric, f"vllm:{metric}")
        assert every_family[name].type == ("histogram" if metric in SLO_HISTOGRAMS else "gauge"), metric
    for name in (serving_metrics.RUNNING, serving_metrics.WAITING, serving_metrics.KV_USAGE):
        assert every_family[name].type == "gauge", name
    for name in (serving_metrics.PREFIX_QUERIES, serving_metrics.PREFIX_HITS, serving_metrics.GENERATION_TOKENS):
        assert every_family[family(name, every_family)].type == "counter", name
    for name in (serving_metrics.TTFT, serving_metrics.ITL):
        assert every_family[name].type == "histogram", name
