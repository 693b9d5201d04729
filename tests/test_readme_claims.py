"""Smaller README claims that code can check: the server's routes, `SamplingParams`' fields, what `make generate`
runs, the supported architectures, each benchmark row's command, the RTN defaults and the JSON flags' keys."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _routes() -> set[str]:
    """Every path the server's FastAPI apps declare (engine/server/*.py: decorators and Starlette `Route`s),
    `{model_id:path}` as `{id}`."""
    declared = set()
    for source in sorted((ROOT / "engine" / "server").glob("*.py")):
        declared |= set(re.findall(r"@app\.(?:get|post|api_route)\(\"([^\"]+)\"", source.read_text()))
        declared |= set(re.findall(r"\bRoute\(\"([^\"]+)\"", source.read_text()))  # an ASGI endpoint (invocations.py)
    return {re.sub(r"\{\w+(?::\w+)?\}", "{id}", route) for route in declared}


def test_every_route_is_in_the_readme_and_every_route_it_names_exists():
    routes = _routes()
    sections = [README.split(f"\n## {title}\n")[1].split("\n## ")[0] for title in ("Server", "LoRA adapters")]
    named = {p for text in sections for p in re.findall(r"`(?:GET |POST )?(/(?:v[12]/)?[a-z_]+(?:/[a-z_{}]+)*)`", text)}
    assert sorted(named - routes) == []
    assert sorted(routes - named) == []


def test_sampling_params_fields_are_the_readmes():
    from flotilla.engine import SamplingParams

    listed = README.split("`SamplingParams` has vLLM's fields:")[1].split("`structured_outputs`")[0]
    listed = re.sub(r"\([^()]*\)", "", listed)  # a field's values and links, in parentheses
    documented = set(re.findall(r"`(\w+)`", listed)) | {"structured_outputs"}
    assert documented == set(SamplingParams.model_fields)


def test_make_generate_runs_what_the_readme_says():
    said = re.search(r"`make generate` runs the offline path instead \(`(flotilla generate [^`]*)`\)", README).group(1)
    recipe = (ROOT / "Makefile").read_text().split("\ngenerate:")[1].split("\n\n")[0]
    command = re.search(r"\$\(VENV\)/bin/(flotilla generate .*)", recipe).group(1)
    assert command.startswith(said.split('"')[0])


def test_the_supported_architectures_are_the_registrys():
    from flotilla.engine.models.registry import supported_architectures

    said = " ".join(README.split()).split("Supported architectures:")[1].split(". The table")[0]
    assert sorted(re.findall(r"`(\w+For(?:CausalLM|SequenceClassification))`", said)) == supported_architectures()


def test_every_benchmark_row_names_its_command():
    """A row's last cell names the command (in backticks), or each result JSON it names records its command: in the
    README's current figures and in docs/benchmark-history.md."""
    import json

    command = re.compile(r"`[^`]*\b(?:python3?|bash|make|flotilla|pytest|BUDGET_S=|OUT=|N=)[^`]*`")
    for doc in ("README.md", "docs/benchmark-history.md"):  # the current figures and the log they come from
        bench = (ROOT / doc).read_text().split("<!-- bench:begin -->")[1].split("<!-- bench:end -->")[0]
        rows = [line for line in bench.splitlines() if line.startswith("| ") and not line.startswith("|---")]
        headers = [row for row in rows if row.rstrip(" |").endswith(("result", "command → result"))]
        silent = []
        for row in rows:
            if row in headers or command.search(row.rsplit(" | ", 1)[-1]):
                continue
            results = re.findall(r"bench/results/[\w./-]+\.json", row)
            if not results or not all("command" in json.loads((ROOT / r).read_text()) for r in results):
                silent.append(row[:80])
        assert len(headers) >= 2 and silent == [], doc


def test_rtn_defaults_are_the_readmes():
    """"`RTN_NUM_BITS` 8 (default) or 4, `RTN_GROUP_SIZE` ... (default 128, -1 per row"."""
    from flotilla.engine_rules import rtn_settings

    flat = " ".join(README.split())
    bits, group = (int(n) for n in re.search(r"`RTN_NUM_BITS` (\d+) \(default\).*?`RTN_GROUP_SIZE` inputs per "
                                             r"symmetric scale \(default (\d+), -1 per row", flat).groups())
    assert rtn_settings({}) == (bits, group)
    assert rtn_settings({"RTN_NUM_BITS": "4", "RTN_GROUP_SIZE": "-1"}) == (4, None)


def test_json_flag_examples_use_the_configs_keys():
    """`--structured-outputs-config '{...}'` examples and the `--speculative-config` JSON the README shows name
    only keys their config models have (an unknown key refuses to start)."""
    from flotilla.engine.spec_decode.config import SpeculativeConfig
    from flotilla.engine.structured_output.config import StructuredOutputsConfig

    docs = [README, *((ROOT / "docs").glob("*.md"))]
    texts = [d if isinstance(d, str) else d.read_text() for d in docs]
    examples = [m for t in texts for m in re.findall(r"--structured-outputs-config\s*'(\{[^']*\})'", t)]
    assert examples and all(set(json.loads(e)) <= set(StructuredOutputsConfig.model_fields) for e in examples)
    section = README.split("\n## Speculative decoding\n")[1].split("\n## ")[0]
    keys = set(re.findall(r'"(\w+)":', section.split("Figures (")[0]))
    assert keys and keys <= set(SpeculativeConfig.model_fields), keys - set(SpeculativeConfig.model_fields)


def test_every_serve_command_the_docs_give_without_a_model_starts_on_the_embedded_model(embedded_model_dir):
    """`flotilla serve --flags` in the README or docs/ (no MODEL: the embedded model) is a configuration the engine
    accepts, as a reader would paste it (`-tp 2` was refused: the model's 9 query and 3 KV heads)."""
    from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
    from flotilla.engine.config import EngineConfig
    from flotilla.engine.server.cli import build_parser

    texts = [README, *(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))]
    commands = {c for text in texts for c in re.findall(r"`flotilla serve( -[^`]+)`", text)}
    assert any("-tp" in c for c in commands)
    for command in sorted(commands):
        args = build_parser().parse_args(command.split())
        EngineConfig.from_kwargs(args.model, **flag_values(args, ENGINE_COMPONENTS))
