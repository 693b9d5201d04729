"""The names the README and docs/*.md mention exist: repository paths, `FLOTILLA_*` switches, command-line
flags and the Python names they put in backticks. Renames rot docs silently; these checks are a text scan."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

from flotilla.removed_flags import REMOVED
from flotilla.underscore_flags import dashed_name

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "charts" / "flotilla" / "README.md"]
TOP = ("engine", "kernels", "operator", "flotilla", "bench", "tests", "docs", "charts", "crds", "images", "scripts",
       "examples")
# Named on purpose though not in this tree, each with why.
ABSENT_PATHS = {
    "bench/results/host10-gpu.sh": "on branch host10, as the README says",
    "bench/results/prefix14-gpu.sh": "on branch prefix14, as the README says",
}
# Flags of other tools (helm, kubectl, podman, buildah, debootstrap, the Prometheus Adapter) and vLLM flags named as
# vLLM's.
OTHER_FLAGS = {"--create-namespace", "--from-file", "--config", "--build-arg", "--gpus", "--ignorefile", "--variant",
               "--include", "--isolation", "--swap-space",
               "--replicas", "--cascade", "--kube-version", "--type",
               "--subresource", "--current-replicas", "--disable-eviction"}
# Backticked names that are other projects' (xgrammar, vLLM, the Prometheus Operator's Prometheus and
# ServiceMonitor fields) or a family of bench/serve.py's report keys.
OTHER_NAMES = {"max_whitespace_cnt", "structural_tag", "whitespace_pattern", "send_delay_ms", "head_delay_ms",
               "serviceMonitorSelector", "serviceMonitorNamespaceSelector", "enforcedSampleLimit", "honorLabels",
               # vLLM's, named in docs/classify.md as vLLM's
               "as_seq_cls_model", "get_classification_activation_function", "activation_fn",
               "sentence_transformers.activation_fn", "sbert_ce_default_activation_function", "pooling_params",
               "tokenization_kwargs"}


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode or not listed.stdout:
        pytest.skip("not a git checkout (a `git archive` copy): nothing to scan against")
    return [p for p in listed.stdout.splitlines() if (ROOT / p).is_file()]


@cache
def tracked() -> tuple[set[str], set[str]]:
    """Files and folders git tracks."""
    files = set(_tracked())
    folders = {str(Path(p).parent) for p in files}
    folders |= {str(parent) for f in list(folders) for parent in Path(f).parents}
    return files, folders - {"."}


def _exists(path: str, prefix: bool) -> bool:
    files, folders = tracked()
    path = path.rstrip("/")
    if path.startswith("flotilla/") and path.split("/")[1] in ("engine", "kernels", "operator"):
        path = path.removeprefix("flotilla/")  # the package's name for the folder
    if prefix:  # `bench/results/call{2,3}/`, `...-*.json`: some path starts so
        return any(p.startswith(path) for p in files | folders)
    return path in files or path in folders


def test_every_repository_path_the_docs_name_exists():
    named = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./-]*)(.?)")
    missing = []
    for doc in DOCS:
        for raw, after in named.findall(doc.read_text()):
            path = raw.rstrip(".-")  # a sentence's full stop; `...-2026-12-03-*`
            if path not in ABSENT_PATHS and not _exists(path, prefix=bool(after) and after in "*{…"):
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert missing == []


@cache
def _code_text() -> str:
    files, _ = tracked()
    return "\n".join((ROOT / p).read_text(errors="ignore") for p in sorted(files)
                     if p.endswith((".py", ".sh", ".yaml", ".tpl", ".Containerfile", "Makefile")))


def test_every_flotilla_switch_the_docs_name_is_read_somewhere():
    code = _code_text()
    unknown = {f"{doc.relative_to(ROOT)}: {name}" for doc in DOCS
               for name in re.findall(r"\bFLOTILLA_[A-Z0-9_]*[A-Z0-9]\b", doc.read_text()) if name not in code}
    assert sorted(unknown) == []


def test_every_flotilla_switch_the_package_reads_is_documented():
    """COMMON rule: a new env switch is documented (docs/decode-gemm.md, docs/quantization.md, ...)."""
    files, _ = tracked()
    docs = "\n".join(doc.read_text() for doc in DOCS)
    undocumented = {f"{p}: {name}" for p in sorted(files) if p.endswith(".py") and p.split("/")[0] in TOP[:4]
                    for name in re.findall(r"[\"'](FLOTILLA_[A-Z0-9_]+)[\"']", (ROOT / p).read_text())
                    if name not in docs}
    assert sorted(undocumented) == []


def _known_flags() -> set[str]:
    from flotilla.engine.generate_cli import build_parser as generate_parser
    from flotilla.engine.server.cli import build_parser as serve_parser
    from flotilla.operator.main import parse_args

    flags = {o for parser in (serve_parser(), generate_parser()) for a in parser._actions for o in a.option_strings}
    flags |= set(REMOVED) | {"--guided-decoding"}  # vLLM's removed flags, refused by name (`--guided-decoding-*`)
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), contextlib.suppress(SystemExit):
        parse_args(["--help"])
    flags |= set(re.findall(r"--[\w-]+", help_text.getvalue()))
    # The benchmarks', scripts' and test tools' own command lines.
    files, _ = tracked()
    for p in sorted(files):
        if p.endswith(".py") and p.split("/")[0] in ("bench", "scripts", "charts", "tests"):
            flags |= set(re.findall(r"add_argument\(\s*(?:\"-\w\",\s*)?\"(--[\w-]+)\"", (ROOT / p).read_text()))
    return flags


def test_every_flag_the_docs_name_exists():
    known = _known_flags() | OTHER_FLAGS
    # vLLM's underscore spelling (`--max_model_len`) names the dashed flag (flotilla/underscore_flags.py)
    unknown = {f"{doc.relative_to(ROOT)}: {flag}" for doc in DOCS
               for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*[a-z0-9])", doc.read_text())
               if dashed_name(flag) not in known}
    assert sorted(unknown) == []


def test_every_python_name_the_docs_put_in_backticks_exists():
    """`name()`, `module.attr`, `snake_case` and `camelCase` in backticks: each part is a word of some tracked
    file (code, config, or a file's own name), so a renamed function or field shows up here."""
    files, _ = tracked()
    docs = {str(doc.relative_to(ROOT)) for doc in DOCS}
    words: set[str] = set()
    for p in files:
        words |= set(re.findall(r"\w+", p))
        if p not in docs and not (p.startswith("bench/results/") and p.endswith((".json", ".log", ".jsonl"))):
            words |= set(re.findall(r"\w+", (ROOT / p).read_text(errors="ignore")))
    unknown = []
    for doc in DOCS:
        for token in re.findall(r"`([^`\n]+)`", doc.read_text()):
            m = re.fullmatch(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(\(\))?", token)
            if not m or not (m.group(2) or "_" in m.group(1) or re.search(r"[a-z][A-Z]", m.group(1))):
                continue
            if token not in OTHER_NAMES and any(part not in words for part in m.group(1).split(".")):
                unknown.append(f"{doc.relative_to(ROOT)}: {token}")
    assert unknown == []


def test_the_operator_synopsis_is_its_command_line(monkeypatch):
    """docs/operator.md's `flotilla operator [...]` block names every option, with the parser's default where it
    shows a value rather than a placeholder."""
    import argparse

    from flotilla.operator.main import parse_args

    parsers = []

    def grab(self, *args, **kwargs):
        parsers.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with contextlib.suppress(SystemExit):
        parse_args([])
    text = (ROOT / "docs" / "operator.md").read_text()
    synopsis = re.search(r"```\n(flotilla operator .*?)```", text, re.S).group(1)
    shown = dict(re.findall(r"\[(-[\w-]+)(?: ([^\]\s]+))?", synopsis))
    problems = []
    for action in parsers[0]._actions:
        if action.option_strings == ["-h", "--help"]:
            continue
        option = next((o for o in action.option_strings if o in shown), None)
        if option is None:
            problems.append(f"{action.option_strings} is not in the synopsis")
        elif shown[option] and not shown[option].isupper():
            value = shown[option]
            number = isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
            same = float(value) == action.default if number else value == action.default
            if not same:
                problems.append(f"{option} {value}: the default is {action.default!r}")
    assert problems == []


def test_the_server_limits_table_has_the_codes_values():
    """docs/server.md's request limits: each "`--flag` (8 MiB" is the flag's default, each "2048 (`NAME`,
    engine/server/serving.py)" that module's constant."""
    import importlib

    from flotilla.flags import flag

    text = (ROOT / "docs" / "server.md").read_text()
    table = text.split("| what | flag (default) | over the limit |")[1].split("\n\n")[0]
    scale = {"KiB": 2**10, "MiB": 2**20, "s": 1, "": 1}
    defaults = re.findall(r"`(--[\w-]+)` \(([\d,.]+) ?(KiB|MiB|s)?\b", table)
    constants = re.findall(r"([\d,]+)(?: \w+)? \(`([A-Z_]+)`, (engine/[\w/]+)\.py\)", table)
    assert len(defaults) >= 8 and len(constants) >= 2
    for name, number, unit in defaults:
        assert float(number.replace(",", "")) * scale[unit or ""] == flag(name).default, name
    for number, constant, path in constants:
        module = importlib.import_module("flotilla." + path.replace("/", "."))
        assert getattr(module, constant) == int(number.replace(",", "")), constant


def test_the_open_routes_docs_server_lists_are_the_servers():
    """docs/server.md's "Open routes" table is PUBLIC_PATHS: every path but these needs the API key."""
    from flotilla.engine.server.app import PUBLIC_PATHS

    text = (ROOT / "docs" / "server.md").read_text()
    table = text.split("\n### Open routes\n")[1].split("\n### ")[0].split("| route | reveals or does | why open |")[1]
    rows = [line.split(" | ")[0] for line in table.strip().split("\n\n")[0].splitlines()[1:]]
    assert {route for row in rows for route in re.findall(r"`(/[\w./]+)`", row)} == set(PUBLIC_PATHS)


def test_the_pooling_flags_table_is_the_declaration():
    """docs/embeddings.md's flag table: the values column is each flag's supported values, and what it calls
    "declared, not supported" is declared and unsupported."""
    from flotilla.flags import flag

    text = (ROOT / "docs" / "embeddings.md").read_text()
    rows = re.findall(r"^\| `(--[\w-]+)` \| ([^|]+) \| ([^|]+) \|$", text, re.M)
    assert [name for name, _, _ in rows] == ["--runner", "--convert", "--task"]
    for name, values, meaning in rows:
        f = flag(name)
        assert set(re.findall(r"`(\w+)`", values)) == set(f.supported_values or f.choices), name
        declared = re.search(r"((?:`\w+`/?)+) (?:is|are) declared, not supported", meaning)
        unsupported = set(f.choices or ()) - set(f.supported_values or ())
        assert declared is None or set(re.findall(r"`(\w+)`", declared.group(1))) <= unsupported, name
