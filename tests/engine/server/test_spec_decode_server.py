"""`flotilla serve --speculative-config`: the same completions, the vllm:spec_decode_* counters on
/metrics, and a bad config refused at start-up naming the flag."""

from __future__ import annotations

import json

import httpx

from .conftest import API_KEY, start_tiny_server, stop_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def test_speculating_server_answers_like_the_plain_one_and_counts(server, tiny_model_dirs, tmp_path):
    model = tiny_model_dirs["llama"]
    config = json.dumps({"model": str(model), "num_speculative_tokens": 3})
    spec = start_tiny_server(model, tmp_path / "spec.log", "--speculative-config", config)
    try:
        body = {"model": "tiny", "prompt": "the the the the the", "max_tokens": 12, "temperature": 0,
                "logprobs": 1}
        want = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=60).json()
        got = httpx.post(f"{spec.url}/v1/completions", json=body, headers=HEADERS, timeout=60).json()
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        assert got["choices"][0]["logprobs"]["tokens"] == want["choices"][0]["logprobs"]["tokens"]
        assert got["usage"] == want["usage"]
        metrics = spec.metrics()
        assert metrics['vllm:spec_decode_num_drafts_total{model_name="tiny"}'] > 0
        accepted = metrics['vllm:spec_decode_num_accepted_tokens_total{model_name="tiny"}']
        assert accepted == metrics['vllm:spec_decode_num_draft_tokens_total{model_name="tiny"}'] > 0
        assert metrics['vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny",position="0"}'] > 0
        assert not any(k.startswith("vllm:spec_decode") for k in server.metrics())
    finally:
        stop_server(spec)


def test_a_bad_config_stops_start_up_naming_the_flag(tiny_model_dirs, monkeypatch, capsys):
    # The server's `main` in this process (a process cost CI an import of torch): a config taken by mistake fails
    # here at once instead of starting an engine.
    from flotilla.engine.server import cli

    def no_engine(*args: object, **kwargs: object) -> None:
        raise AssertionError("the config was taken: the engine would start")

    monkeypatch.setattr(cli, "_start_engine", no_engine)
    status = cli.main([str(tiny_model_dirs["llama"]), "--speculative-config",
                       '{"method": "ngram", "num_speculative_tokens": 0}'])
    err = capsys.readouterr().err
    assert status == 2 and "--speculative-config" in err and "num_speculative_tokens" in err, err
