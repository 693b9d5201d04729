"""The README stays true: its two commands exist, its flag table is the flag declaration's."""

from __future__ import annotations

import re
from pathlib import Path

from flotilla.flags import markdown_table

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


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
    bench = README.split("<!-- bench:begin -->")[1].split("<!-- bench:end -->")[0]
    for path in re.findall(r"bench/results/[\w./-]+\.json", bench):
        assert (ROOT / path).is_file(), path
