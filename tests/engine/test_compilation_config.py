"""vLLM's --compilation-config and -O (--optimization-level): what maps onto the CUDA graphs (none, or which sizes),
and every other key refused by name (flotilla/compilation_config.py)."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.arg_parser import ENGINE_COMPONENTS, flag_values
from flotilla.engine.config import ConfigError, EngineConfig
from flotilla.engine.cuda_graphs import StepGraphs
from flotilla.engine.llm_engine import LLMEngine
from flotilla.engine.server.cli import build_parser


def _config(model, *argv: str) -> EngineConfig:
    return EngineConfig.from_kwargs(str(model), **flag_values(build_parser().parse_args(argv), ENGINE_COMPONENTS))


@pytest.mark.parametrize(("argv", "eager"), [
    ((), False),
    (("-O0",), True),  # vLLM's -O0: no compilation, no CUDA graphs
    (("-O", "1"), False),
    (("--optimization-level", "3"), False),
    (("-O3", "--enforce-eager"), True),  # --enforce-eager wins, as vLLM's
    (("-cc", '{"cudagraph_mode": "NONE"}'), True),
    (("--compilation-config", '{"level": 0}'), True),
    (("--compilation-config", '{"mode": 3}'), False),
    (("-O0", "-cc", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'), False),  # a key set wins over the level's default
    # vLLM's validators take cudagraph_mode in any case and mode by its CompilationMode name
    (("-cc", '{"cudagraph_mode": "none"}'), True),
    (("-O0", "-cc", '{"cudagraph_mode": "full"}'), False),
    (("-cc", '{"mode": "none"}'), True),
    (("-O0", "-cc", '{"mode": "VLLM_COMPILE"}'), False),
])
def test_graphs_are_off_exactly_where_vllm_turns_them_off(tiny_model_dirs, argv, eager):
    assert _config(tiny_model_dirs["llama"], *argv).model.enforce_eager is eager


def test_capture_sizes_are_the_sizes_the_runner_captures(tiny_model_dirs):
    config = _config(tiny_model_dirs["llama"], "--max-num-seqs", "8", "--max-num-batched-tokens", "2048",
                     "-cc", '{"cudagraph_capture_sizes": [64, 1, 4, 2, 4]}')
    assert config.model.compilation_config == {"cudagraph_capture_sizes": [1, 2, 4, 64]}
    assert config.model.max_cudagraph_capture_size == 64  # vLLM's: the largest of them
    # the graphs the engine's runner would capture (on the CPU it builds them without capturing)
    engine = LLMEngine.from_kwargs(str(tiny_model_dirs["llama"]), max_model_len=256, max_num_seqs=8,
                                   max_num_batched_tokens=2048,
                                   compilation_config={"cudagraph_capture_sizes": [64, 1, 4, 2, 4]})
    graphs = engine.runner._step_graphs()
    # decode graphs: the sizes up to --max-num-seqs rows; mixed graphs: every size within the step's token budget
    assert (graphs.decode_sizes, graphs.mixed_sizes) == ([1, 2, 4], [1, 2, 4, 64])
    default = StepGraphs(torch.nn.Identity(), 8, 2048, 256, 16, torch.device("cpu"))
    assert (default.decode_sizes, default.mixed_sizes) == ([1, 2, 4, 8], [16, 32, 64, 128, 256, 512])


def test_max_cudagraph_capture_size_as_a_key_is_the_flag(tiny_model_dirs):
    config = _config(tiny_model_dirs["llama"], "-cc", '{"max_cudagraph_capture_size": 1024}')
    assert config.model.max_cudagraph_capture_size == 1024 and config.model.compilation_config == {}


@pytest.mark.parametrize(("argv", "message"), [
    (("-cc", '{"backend": "inductor"}'), "--compilation-config: backend: not a key this engine maps (it takes "
                                          "cudagraph_capture_sizes, max_cudagraph_capture_size, max_capture_size, "
                                          "cudagraph_mode, level, mode): nothing is compiled with torch.compile here"),
    (("-cc", '{"cudagraph_mode": "PIECEWISE"}'), "--compilation-config: cudagraph_mode PIECEWISE is not supported: "
                                                  "graphs here capture whole steps"),
    (("-cc", '{"cudagraph_mode": "partial"}'), "--compilation-config: cudagraph_mode must be one of NONE, FULL, "
                                                "FULL_AND_PIECEWISE, PIECEWISE, FULL_DECODE_ONLY, not \"PARTIAL\""),
    (("-cc", '{"cudagraph_mode": "piecewise"}'), "--compilation-config: cudagraph_mode PIECEWISE is not supported"),
    (("-cc", '{"mode": "stock_torch_compile"}'), "--compilation-config: mode 1 is not supported"),
    (("-cc", '{"mode": "FAST"}'), "--compilation-config: mode \"FAST\" is not supported"),
    (("-cc", '{"level": 1}'), "--compilation-config: level 1 is not supported: 0 (no compilation, no CUDA graphs) "
                              "or 3"),
    (("-cc", '{"cudagraph_capture_sizes": [1, 0]}'), "--compilation-config: cudagraph_capture_sizes must be a "
                                                      "non-empty list of integers >= 1, not [1, 0]"),
    (("-cc", '{"cudagraph_capture_sizes": [8, 16]}', "--max-cudagraph-capture-size", "32"),
     "--compilation-config: the largest captured size is given as 16 and 32"),
    (("-cc", '{"cudagraph_capture_sizes": [512]}', "--max-num-seqs", "256"),
     "--compilation-config: cudagraph_capture_sizes has no size up to --max-num-seqs (256)"),
    (("-cc", "[1]"), "--compilation-config must be a JSON object"),
])
def test_what_has_no_meaning_here_is_refused_by_name(tiny_model_dirs, argv, message):
    with pytest.raises(ConfigError) as refused:
        _config(tiny_model_dirs["llama"], *argv)
    assert str(refused.value).startswith(message), str(refused.value)


def test_an_optimization_level_outside_vllms_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-O4"])
    assert "argument -O/--optimization-level: invalid choice: 4 (choose from 0, 1, 2, 3)" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "warned"), [
    (("-O1",), True),  # vLLM's -O1 is PIECEWISE graphs: here the whole-step ones, said in the log
    (("-O2",), False),
    (("-O3",), False),
    (("-O0",), False),
    (("-O1", "--enforce-eager"), False),
    (("-O1", "-cc", '{"cudagraph_mode": "FULL"}'), False),  # the key, not the level, chose the graphs
])
def test_o1_captures_the_whole_step_graphs_and_the_log_says_so(tiny_model_dirs, caplog, argv, warned):
    with caplog.at_level("WARNING", logger="flotilla.engine.config"):
        config = _config(tiny_model_dirs["llama"], *argv)
    notes = [r.getMessage() for r in caplog.records if "PIECEWISE" in r.getMessage()]
    assert notes == (["-O1: vLLM captures PIECEWISE CUDA graphs at this level (attention outside the graphs); there "
                      "are none here, so the steps replay the engine's whole-step graphs, as at -O2 (give -O0 for no "
                      "graphs)"] if warned else [])
    assert config.model.enforce_eager is (argv[0] == "-O0" or "--enforce-eager" in argv)
