"""The README stays true: its two commands exist, its flag table is the flag declaration's."""

from __future__ import annotations

import re
from pathlib import Path

from flotilla.flags import markdown_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# The README's current figures and the chronological log they are drawn from: each between bench markers.
BENCH_DOCS = ("README.md", "docs/benchmark-history.md")


def bench_section(doc: str) -> str:
    """The text between `doc`'s `<!-- bench:begin -->` and `<!-- bench:end -->` markers."""
    return (ROOT / doc).read_text().split("<!-- bench:begin -->")[1].split("<!-- bench:end -->")[0]


def test_readme_opens_with_the_main_and_test_commands():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    assert first_block.splitlines()[0].startswith("make serve")
    assert first_block.splitlines()[1].startswith("make test")
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^serve:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_flag_table_matches_the_declaration():
    table = README.split("<!-- flags:begin -->\n")[1].split("\n<!-- flags:end -->")[0]
    assert table == markdown_table()


def test_every_serve_flag_is_in_the_readme_flag_table():
    """Every option `flotilla serve --help` lists has a row: the table is the declaration's, so a flag added to
    the parser past the declaration would be served yet undocumented."""
    from flotilla.engine.server.cli import build_parser

    table = README.split("<!-- flags:begin -->\n")[1].split("\n<!-- flags:end -->")[0]
    documented = set(re.findall(r"`(-[\w-]+)`", table))
    served = {option for action in build_parser()._actions for option in action.option_strings} - {"-h", "--help"}
    assert served and served <= documented, sorted(served - documented)


def test_every_benchmark_row_names_a_committed_result():
    for doc in BENCH_DOCS:
        for path in re.findall(r"bench/results/[\w./-]+\.json", bench_section(doc)):
            assert (ROOT / path).is_file(), f"{doc}: {path}"


def test_every_current_figure_is_in_the_history():
    """The README's table holds figures drawn from measured rows: each number in it (a decimal or a thousands
    figure, outside the command cell) is written in docs/benchmark-history.md or elsewhere in the README (the
    speculative decoding and quantization sections), so a figure cannot be typed in without a row behind it."""
    current = bench_section("README.md")
    sources = (ROOT / "docs" / "benchmark-history.md").read_text() + README.replace(current, "")
    rows = [line.rsplit(" | ", 1)[0] for line in current.splitlines() if line.startswith("| ")]
    figures = {n for row in rows for n in re.findall(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+", row)}
    assert len(rows) >= 10 and figures
    assert sorted(n for n in figures if n not in sources) == []


def test_the_readme_links_the_benchmark_history():
    assert "(docs/benchmark-history.md)" in README.split("\n## Benchmarks\n")[1].split("<!-- bench:begin -->")[0]
