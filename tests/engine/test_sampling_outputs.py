"""Sampling parameters end to end on a real (tiny) model: seeds, n > 1, stops, logprobs, text."""

from __future__ import annotations

import pytest
import torch

from flotilla.engine.detokenizer import IncrementalDetokenizer
from flotilla.engine.llm import LLM
from flotilla.engine.model_runner import _plain_greedy
from flotilla.engine.request import Request
from flotilla.engine.sampling_metadata import SamplingRow
from flotilla.engine.sampling_params import SamplingParams

PROMPT = [101, 2034, 887, 41, 9000, 77, 5, 16000, 123, 4567, 88, 12]


@pytest.fixture(scope="module")
def llm(tiny_model_dirs):
    return LLM(str(tiny_model_dirs["llama"]), max_model_len=256, block_size=8)


def _text(llm, prompt, params):
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]


def test_same_seed_same_text_alone_and_inside_a_batch(llm):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    alone = _text(llm, PROMPT, seeded)
    noise = [SamplingParams(temperature=1.3, top_p=0.9, max_tokens=20, ignore_eos=True)] * 5
    others = [[7 + i, 900 + i, 33] for i in range(5)]
    batched = llm.generate(others[:2] + [PROMPT] + others[2:], noise[:2] + [seeded] + noise[2:], use_tqdm=False)
    assert batched[2].outputs[0].token_ids == alone.token_ids
    different = _text(llm, PROMPT, SamplingParams(temperature=1.0, seed=4321, max_tokens=16, ignore_eos=True))
    assert different.token_ids != alone.token_ids


def test_n_completions_share_the_prompt_computation(llm):
    runner, manager = llm.engine.runner, llm.engine.block_manager
    before = runner.num_tokens_fed
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    fresh = [t + 1 for t in PROMPT]  # not in the prefix cache from other tests
    out = llm.generate([fresh], params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 6 for c in out.outputs)
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "completions should be independent draws"
    # The 12-token prompt is fed once; then each of 4 completions feeds its 5 later tokens.
    assert runner.num_tokens_fed - before == len(PROMPT) + 4 * 5
    assert manager.num_free_blocks == manager.num_blocks


def test_forked_completions_share_blocks_and_copy_the_partial_one(tiny_model_dirs):
    engine = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, block_size=8, enable_prefix_caching=False).engine
    leader = engine.add_request(PROMPT, SamplingParams(n=3, temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()  # the prompt, once; three first tokens drawn
    group = engine._groups[leader.request_id]
    full, partial = leader.block_ids  # 12 tokens in blocks of 8
    assert all(c.block_ids == [full, partial] for c in group)
    assert engine.block_manager.blocks[full].ref_count == 3
    plan = engine.scheduler.schedule()
    assert len(plan.block_copies) == 2  # two of three completions copy the shared partial block
    assert engine.block_manager.blocks[partial].ref_count == 1
    engine.scheduler.update(plan, engine.runner.execute(plan).tokens)
    outputs = None
    while engine.has_unfinished_requests():
        outputs = engine.step() or outputs
    texts = {tuple(c.token_ids) for c in outputs[0].outputs}
    assert len(texts) == 1  # greedy: forked completions continue identically from the shared prompt


def test_stop_strings_cut_exactly_even_across_token_boundaries(llm):
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    full = _text(llm, PROMPT, greedy)
    tok = llm.get_tokenizer()
    pieces = [tok.decode(full.token_ids[: i + 1]) for i in range(len(full.token_ids))]
    boundary = len(pieces[5])  # the end of token 6's text
    stop = full.text[boundary - 2 : boundary + 2]  # straddles tokens 6 and 7
    assert len(stop) == 4 and full.text.find(stop) == boundary - 2
    cut = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]))
    assert cut.text == full.text[: boundary - 2]
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop)
    kept = _text(
        llm,
        PROMPT,
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True),
    )
    assert kept.text == full.text[: boundary + 2]


def test_stop_token_ids_and_length(llm):
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    full = _text(llm, PROMPT, greedy)
    stop_id = full.token_ids[3]
    stopped = _text(
        llm, PROMPT, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=[stop_id])
    )
    assert stopped.token_ids == full.token_ids[: full.token_ids.index(stop_id) + 1]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop_id)
    assert (full.finish_reason, full.stop_reason) == ("length", None)
    late = _text(
        llm,
        PROMPT,
        SamplingParams(temperature=0, max_tokens=10, min_tokens=10, ignore_eos=True, stop_token_ids=[stop_id]),
    )
    assert len(late.token_ids) == 10 and stop_id not in late.token_ids[:9]
    # min_tokens with ignore_eos and no stop ids bans nothing: the argmax path, the same tokens.
    bare = SamplingParams(temperature=0, max_tokens=10, min_tokens=10, ignore_eos=True)
    assert _text(llm, PROMPT, bare).token_ids == full.token_ids
    banning = SamplingParams(temperature=0, max_tokens=10, min_tokens=10, ignore_eos=True, stop_token_ids=[stop_id])
    assert _plain_greedy(SamplingRow(Request("r", PROMPT, bare, eos_token_ids=frozenset({2})), 0, 0))
    assert not _plain_greedy(SamplingRow(Request("s", PROMPT, banning), 0, 0))  # its stop id is banned
    assert _plain_greedy(SamplingRow(Request("t", PROMPT, banning), 0, 10))  # min_tokens reached


@pytest.mark.parametrize("slice_rows", [None, 3], ids=["one-slice", "slices-of-3-tokens"])
def test_prompt_logprobs_match_hf(tiny_model_dirs, llm, monkeypatch, slice_rows):
    from transformers import AutoModelForCausalLM

    from flotilla.engine import model_runner

    if slice_rows is not None:  # the prompt's logits in slices (their memory is bounded): the same entries
        vocab = llm.engine.config.model.hf_config["vocab_size"]
        monkeypatch.setattr(model_runner, "PROMPT_LOGPROBS_SLICE_BYTES", slice_rows * 4 * vocab)
    out = llm.generate([PROMPT], SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.float32)
    with torch.inference_mode():
        expected = torch.log_softmax(hf(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(PROMPT)
    for pos in range(1, len(PROMPT)):
        entry = out.prompt_logprobs[pos]
        token = PROMPT[pos]
        assert entry[token][0] == pytest.approx(expected[pos - 1, token].item(), abs=1e-4)
        top2 = expected[pos - 1].topk(2).indices.tolist()
        assert set(top2) <= set(entry)


def test_generated_logprobs_are_consistent(llm):
    out = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=5, logprobs=3, ignore_eos=True))
    assert len(out.logprobs) == 5
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert entry[token][1] == 1  # greedy: the drawn token is the most likely
        assert len(entry) == 3
    assert out.cumulative_logprob == pytest.approx(
        sum(e[t][0] for t, e in zip(out.token_ids, out.logprobs, strict=True))
    )


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_generated_logprobs_are_the_log_softmax_of_hfs_logits(llm, tiny_model_dirs, temperature):
    """Each generated token's logprob and rank, and its top-5, are those of HF's log_softmax at that position:
    the drawn token's (greedy, or sampled wherever it falls) and the top-k's, in HF's order."""
    from transformers import AutoModelForCausalLM

    params = SamplingParams(temperature=temperature, seed=11, max_tokens=8, logprobs=5, ignore_eos=True)
    out = _text(llm, PROMPT, params)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dirs["llama"], dtype=torch.float32)
    with torch.inference_mode():
        logits = hf(torch.tensor([PROMPT + out.token_ids[:-1]])).logits[0, len(PROMPT) - 1 :]
    expected = torch.log_softmax(logits.float(), dim=-1)
    assert len(out.logprobs) == len(out.token_ids) == 8
    for row, token, entry in zip(expected, out.token_ids, out.logprobs, strict=True):
        logprob, rank = entry[token]
        assert logprob == pytest.approx(row[token].item(), abs=1e-4)
        # The rank counts the values >= the token's: within the tolerance, as HF's and the engine's sums differ.
        assert int((row > row[token] + 1e-4).sum()) + 1 <= rank <= int((row >= row[token] - 1e-4).sum())
        top = row.topk(5)
        # The top-5 by their ranks 1..5 (the drawn token, when outside them, ranks 6 or more).
        listed = sorted((r, t, lp) for t, (lp, r) in entry.items() if r <= 5)
        assert [r for r, _, _ in listed] == [1, 2, 3, 4, 5]
        assert [lp for _, _, lp in listed] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert {t for _, t, _ in listed} == set(top.indices.tolist())


def test_multibyte_characters_stream_intact(embedded_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    text = "Ships 🚢 sail: 日本語のテキスト, café, 🏳️‍🌈 done"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, tok.encode("Say:"))
    deltas = [detok.add([i]) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == tok.decode(ids)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_k": 5},
        {"top_p": 0.5},
        {"min_p": 0.2},
        {"presence_penalty": 1.5, "frequency_penalty": 0.5},
        {"repetition_penalty": 1.5},
        {"logit_bias": {5: 10.0}},
    ],
)
def test_every_knob_runs_end_to_end(llm, kwargs):
    out = _text(llm, PROMPT, SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True, **kwargs))
    assert len(out.token_ids) == 8


def test_a_completion_forked_from_a_leader_that_stopped_on_its_first_token_keeps_the_prompt(tiny_model_dirs):
    """The leader of n=2 stops on its first token (a stop id the other completion did not draw): the
    other completion must still continue from the prompt's K/V, not from blocks the leader's finish
    had already returned to the pool (it was forked after them, and got none)."""
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=256, block_size=8)
    for seed in range(50):
        free = SamplingParams(n=2, temperature=1.0, seed=seed, max_tokens=8, ignore_eos=True)
        first, second = llm.generate([PROMPT], free, use_tqdm=False)[0].outputs
        if first.token_ids[0] != second.token_ids[0]:
            break
    else:
        pytest.fail("no seed in range(50) gives the two completions different first tokens")
    stopped = SamplingParams(n=2, temperature=1.0, seed=seed, max_tokens=8, ignore_eos=True,
                             stop_token_ids=[first.token_ids[0]])
    leader, other = llm.generate([PROMPT], stopped, use_tqdm=False)[0].outputs
    assert leader.token_ids == first.token_ids[:1] and leader.finish_reason == "stop"
    cut = next((i + 1 for i, t in enumerate(second.token_ids) if t == first.token_ids[0]), len(second.token_ids))
    assert other.token_ids == second.token_ids[:cut]  # seeded draws: the same tokens from the same K/V
    manager = llm.engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_a_stop_token_is_not_rendered_in_the_text_unless_asked(llm):
    """As vLLM: a request stopped by a stop token (stop_token_ids, EOS) has it in token_ids but not in the
    text, unless include_stop_str_in_output (the text used to end with the stop token's own text)."""
    tok = llm.get_tokenizer()
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    full = _text(llm, PROMPT, greedy)
    at = next(i for i in range(2, 10) if tok.decode(full.token_ids[i : i + 1]).strip())  # a visible token
    stop_id = full.token_ids[at]
    at = full.token_ids.index(stop_id)
    def final(params: SamplingParams):  # through the engine: LLM.generate makes every request final_only
        request = llm.engine.add_request(PROMPT, params)
        while llm.engine.has_unfinished_requests():
            for output in llm.engine.step():
                if output.finished and output.request_id == request.request_id:
                    result = output.outputs[0]
        return result

    for kind in ("final_only", "cumulative"):
        stopped = final(SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=[stop_id],
                                       output_kind=kind))
        assert stopped.token_ids == full.token_ids[: at + 1] and stopped.stop_reason == stop_id
        assert stopped.text == tok.decode(full.token_ids[:at])
        shown = final(SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, output_kind=kind,
                                     stop_token_ids=[stop_id], include_stop_str_in_output=True))
        assert shown.text == tok.decode(full.token_ids[: at + 1])
    # EOS (id 2), drawn first, rendered when special tokens are not skipped
    eos = SamplingParams(temperature=0, max_tokens=5, logit_bias={2: 100.0}, skip_special_tokens=False)
    ended = _text(llm, PROMPT, eos)
    assert (ended.token_ids, ended.finish_reason, ended.text) == ([2], "stop", "")


@pytest.mark.parametrize("min_tokens", [1, 3])
def test_a_stop_string_completed_by_the_min_tokens_th_token_does_not_stop_it(llm, min_tokens):
    """As vLLM (and as EOS and stop ids here, banned for the first min_tokens tokens): no stop before
    min_tokens + 1 tokens. A stop string completed by token number min_tokens stopped the request there, and
    cut off (min_tokens=1: an empty text, what min_tokens exists to prevent)."""
    tok = llm.get_tokenizer()
    full = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    piece = tok.decode(full.token_ids[min_tokens - 1 : min_tokens])
    assert piece and full.text.count(piece) == 1
    stopped = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[piece],
                                                min_tokens=min_tokens))
    assert (stopped.token_ids, stopped.text, stopped.finish_reason) == (full.token_ids, full.text, "length")
    # one token later, it stops
    later = tok.decode(full.token_ids[min_tokens : min_tokens + 1])
    assert later and full.text.count(later) == 1
    cut = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[later],
                                            min_tokens=min_tokens))
    assert (cut.token_ids, cut.stop_reason) == (full.token_ids[: min_tokens + 1], later)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_more_completions_than_max_num_seqs_wait_for_a_slot(tiny_model_dirs, async_scheduling):
    """n = 5 with --max-num-seqs 2: every completion was forked into the running set at once (5 sequences in
    a step; on the GPU past the CUDA graphs' batch). As vLLM (each completion its own queued request), those
    past the cap now wait, and run as slots free: never more than 2 sequences a step, the same tokens as
    with room for all (seeded), every block back in the pool."""
    params = SamplingParams(n=5, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True)
    wide = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, block_size=8, max_num_seqs=8)
    want = [c.token_ids for c in wide.generate([PROMPT], params, use_tqdm=False)[0].outputs]
    engine = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, block_size=8, max_num_seqs=2,
                 async_scheduling=async_scheduling).engine
    scheduled: list[int] = []
    schedule = engine.scheduler.schedule

    def counted(*args, **kwargs):
        plan = schedule(*args, **kwargs)
        scheduled.append(len(plan.scheduled))
        return plan

    engine.scheduler.schedule = counted
    engine.add_request(PROMPT, params, request_id="r")
    finals, running = [], []
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
        running.append(len(engine.scheduler.running))
    assert max(scheduled) <= 2 and max(running) <= 2
    assert [c.token_ids for c in finals[0].outputs] == want
    manager = engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_stop_strings_found_at_the_same_place_stop_on_the_first_listed(llm):
    """A token that completes two stop strings at the same index: vLLM stops on the first one listed (its
    stop_reason, and its text with include_stop_str_in_output); the lexicographically smaller one won."""
    tok = llm.get_tokenizer()
    full = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    start = 0
    for token in full.token_ids:
        piece = tok.decode([token])
        if len(piece) >= 3 and full.text.find(piece[:1]) == start:
            break
        start += len(piece)
    else:
        pytest.fail("no token of 3+ characters whose first character is new")
    longer, shorter = piece[:2], piece[:1]  # "ab" sorts after "a"
    out = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[longer, shorter],
                                            include_stop_str_in_output=True))
    assert (out.text, out.stop_reason) == (full.text[:start] + longer, longer)


def test_a_stream_that_keeps_its_stop_strings_holds_no_text_back(llm):
    """Streamed outputs hold back the last len(stop) - 1 characters, which could be the start of a stop string
    that will be cut. With include_stop_str_in_output nothing is cut, and vLLM holds nothing back: each step's
    output is the whole text so far (it lagged 9 characters behind here)."""
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, stop=["never in the text"],
                            include_stop_str_in_output=True)
    engine.add_request(PROMPT, params, "kept")
    tok = llm.get_tokenizer()
    while engine.has_unfinished_requests():
        for out in engine.step():
            completion = out.outputs[0]
            assert completion.text == tok.decode(completion.token_ids)


def test_an_eos_id_of_generation_config_other_than_the_tokenizers_is_the_stop_reason(tiny_model_dirs, tmp_path):
    """generation_config.json's eos_token_id list ([2, 7] here; Llama 3.1 Instruct's <|eom_id|> beside <|eot_id|>):
    vLLM stops on the tokenizer's EOS with stop_reason None and on the others as stop token ids, whose id is the
    stop_reason (both were None here). Each id is forced by logit_bias; ignore_eos ignores both."""
    import json
    import shutil

    model = shutil.copytree(tiny_model_dirs["llama"], tmp_path / "llama")
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, 7]}))
    llm = LLM(str(model), max_model_len=64, block_size=8)
    for token, reason in ((2, None), (7, 7)):
        out = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=4, logit_bias={token: 100.0}))
        assert (out.token_ids, out.finish_reason, out.stop_reason) == ([token], "stop", reason)
        kept = _text(llm, PROMPT, SamplingParams(temperature=0, max_tokens=4, logit_bias={token: 100.0},
                                                 ignore_eos=True))
        assert (kept.token_ids, kept.finish_reason) == ([token] * 4, "length")


def test_sampling_params_truncate_prompt_tokens_keeps_the_last_tokens_as_vllm(llm):
    # vLLM's SamplingParams(truncate_prompt_tokens=N): the engine keeps the prompt's last N tokens (-1: the context).
    long = [(37 * i) % 30000 + 5 for i in range(300)]  # over the 256-token context
    cut = llm.generate([long], SamplingParams(temperature=0, max_tokens=4, truncate_prompt_tokens=20),
                       use_tqdm=False)[0]
    tail = llm.generate([long[-20:]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert cut.prompt_token_ids == long[-20:] and cut.outputs[0].token_ids == tail.outputs[0].token_ids
    text = "the quick brown fox jumps over the lazy dog"
    ids = llm.get_tokenizer().encode(text)
    by_text = llm.generate(text, SamplingParams(max_tokens=1, truncate_prompt_tokens=3), use_tqdm=False)[0]
    assert by_text.prompt_token_ids == ids[-3:]
    whole = llm.generate([long[:100]], SamplingParams(max_tokens=1, truncate_prompt_tokens=-1), use_tqdm=False)[0]
    assert whole.prompt_token_ids == long[:100]
    for bad in (0, 257):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            llm.generate([long], SamplingParams(max_tokens=1, truncate_prompt_tokens=bad), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_logprob_ranks_count_ties_as_vllm(tiny_model_dirs, tmp_path):
    # vLLM ranks a token by how many logprobs are >= its own (batched_count_greater_than), and a token of the
    # top-N keeps its top-N position. On a model whose logits all tie (lm_head zeroed: bf16 ties, taken to the
    # extreme) a token outside the top-N is ranked last (the vocabulary size), not first.
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    model_dir = tmp_path / "flat"
    shutil.copytree(tiny_model_dirs["llama"], model_dir)
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shard = model_dir / index["weight_map"]["lm_head.weight"]
    tensors = load_file(shard)
    tensors["lm_head.weight"].zero_()
    save_file(tensors, shard, metadata={"format": "pt"})
    llm = LLM(str(model_dir), max_model_len=64, block_size=8)
    vocab = llm.engine.vocab_size
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=2, logprobs=1, prompt_logprobs=2),
                       use_tqdm=False)[0]
    outside = 0
    for entry, token, n in [*((e, t, 2) for e, t in zip(out.prompt_logprobs[1:], PROMPT[1:], strict=True)),
                            *((e, t, 1) for e, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids,
                                                        strict=True))]:
        top = sorted(r for t, (_, r) in entry.items() if t != token)
        if len(entry) > n:  # the token is not one of the top-N: every logprob ties with it
            assert entry[token][1] == vocab and top == list(range(1, n + 1))
            outside += 1
        else:
            assert sorted(r for _, r in entry.values()) == list(range(1, n + 1))
    assert outside >= len(PROMPT) - 3


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_request_with_more_completions_than_free_slots_starts_while_others_run(tiny_model_dirs, async_scheduling):
    """n = 4 under --max-num-seqs 4 while 3 long requests run: the request waited for n + 1... free sequence slots
    (all its completions at once), and as the queue is first come first served, every request behind it waited
    too: the batch drained to empty before it ran (one client's n stalled everyone's admissions). As vLLM (each
    completion its own queued request), its first completion starts in the free slot and the others wait for
    slots of their own: the batch stays full. Same tokens as with room for all (seeded); every block back."""
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=4, ignore_eos=True)
    roomy = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, block_size=8, max_num_seqs=8)
    want = sorted(c.token_ids for c in roomy.generate([PROMPT], params, use_tqdm=False)[0].outputs)
    engine = LLM(str(tiny_model_dirs["llama"]), max_model_len=64, block_size=8, max_num_seqs=4,
                 async_scheduling=async_scheduling).engine
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(3):
        engine.add_request(PROMPT, long, request_id=f"long{i}")
    finals = []
    for _ in range(2):
        finals += [o for o in engine.step() if o.finished]
    engine.add_request(PROMPT, params, request_id="wide")
    started = False
    while not started and not finals:  # until the wide request runs or a long one ends (it waited for them)
        finals += [o for o in engine.step() if o.finished]
        started = any(r.request_id.startswith("wide") for r in engine.scheduler.running)
    assert started and not finals, "the n = 4 request waited for the running requests to end"
    while engine.has_unfinished_requests():
        finals += [o for o in engine.step() if o.finished]
    wide = next(o for o in finals if o.request_id == "wide")
    assert sorted(c.token_ids for c in wide.outputs) == want
    manager = engine.block_manager
    assert manager.num_free_blocks == manager.num_blocks
