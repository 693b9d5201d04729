"""Where a thinking request's grammar starts (structured_output/thinking.py) and the one reasoning parser the server and
the engine share (`--reasoning-parser` or --structured-outputs-config's `reasoning_parser`)."""

from __future__ import annotations

import pytest

from flotilla.engine.structured_output.thinking import ThinkingMarkers

START, END, X = 7, 8, 1
MARKERS = ThinkingMarkers(START, END)


@pytest.mark.parametrize("prompt, ended", [
    ([], False),  # no marker: the model may open the thinking itself (qwen3), so the grammar waits
    ([X, X], False),
    ([X, START, X], False),  # deepseek_r1's template opens <think>
    ([X, START, X, X, END, X], True),  # enable_thinking false: <think>\n\n</think>\n\n
    ([START, END, X, START], False),  # a later <think> opens the thinking again
    ([END], True),
])
def test_a_prompt_has_ended_its_thinking_when_its_last_marker_is_the_end(prompt, ended):
    assert MARKERS.ended(prompt) is ended


def test_the_server_and_the_engine_share_one_reasoning_parser():
    from flotilla.engine.config import EngineConfig, ServerConfig
    from flotilla.engine.server.cli import share_reasoning_parser

    from_flag = share_reasoning_parser(EngineConfig.from_kwargs(), ServerConfig.from_kwargs(reasoning_parser="qwen3"))
    assert from_flag[0].structured_outputs.reasoning_parser == from_flag[1].reasoning_parser == "qwen3"
    keyed = EngineConfig.from_kwargs(structured_outputs_config='{"reasoning_parser": "deepseek_r1"}')
    from_key = share_reasoning_parser(keyed, ServerConfig.from_kwargs())
    assert from_key[0].structured_outputs.reasoning_parser == from_key[1].reasoning_parser == "deepseek_r1"
    with pytest.raises(ValueError, match="differ"):
        share_reasoning_parser(keyed, ServerConfig.from_kwargs(reasoning_parser="qwen3"))
