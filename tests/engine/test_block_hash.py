"""Prefix-cache keys (engine/block_hash.py): blocks a client crafts to collide under Python's `hash` get distinct
keys under the default sha256, so no request is served another prompt's cached K/V."""

from __future__ import annotations

from typing import get_args

import pytest

from flotilla.engine.block_hash import ROOT, HashAlgo, hash_block, hash_blocks
from flotilla.engine.block_manager import BlockManager
from flotilla.engine.llm import LLM
from flotilla.engine.request import Request
from flotilla.engine.sampling_params import SamplingParams
from flotilla.flags import FLAGS

WRAP = 2**61 - 1  # CPython hashes an int modulo this prime: hash(WRAP + t) == hash(t)


def test_blocks_whose_builtin_hashes_collide_get_distinct_sha256_keys():
    """hash(-1) == hash(-2) in CPython, and a wrapped id hashes as the valid one, so these tuples collide under
    `builtin` (whatever the parent: the tokens' tuple hash ignores it); sha256 tells every pair apart."""
    pairs = [((5, -1, 9), (5, -2, 9)), ((7, 8, 9), (7 + WRAP, 8, 9)), ((3, 4), (3, 4 + 2 * WRAP))]
    for a, b in pairs:
        assert hash_block(None, a, algo="builtin") == hash_block(None, b, algo="builtin")
        assert hash_block(None, a) != hash_block(None, b)
        assert hash_block(ROOT, a) != hash_block(ROOT, b)
    # ids past int64 are hashed too (the engine refuses them after the look-up), and still told apart
    assert hash_block(None, (1, 2**70)) != hash_block(None, (1, 2**70 + 1))


def test_sha256_keys_chain_and_separate_extra_keys():
    """A run of blocks is the chain of single-block keys; extra keys (LoRA id, salt) and their types are part of
    the key, and keys are 16 bytes."""
    tokens = list(range(100, 164))
    keys = hash_blocks(None, tokens, 16, (3,))
    chain = [hash_block(None, tokens[:16], (3,))]
    for i in range(1, 4):
        chain.append(hash_block(chain[-1], tokens[16 * i : 16 * i + 16], (3,)))
    assert keys == chain and all(isinstance(k, bytes) and len(k) == 16 for k in keys)
    variants = [(), (3,), ("3",), (b"3",), (3, "a"), ("3a",), ("a", 3), (33,)]
    assert len({hash_block(None, tokens[:16], extra) for extra in variants}) == len(variants)
    with pytest.raises(TypeError, match="extra key"):
        hash_block(None, tokens[:16], (1.5,))


@pytest.mark.parametrize("algo", ["sha256", "builtin"])
@pytest.mark.parametrize("big", [False, True])
def test_a_run_with_first_block_keys_is_the_chain_of_single_blocks(algo, big):
    """`first_extra_keys` keys the run's first block alone (a prompt's salt), as `hash_block` of that block with them
    and then of each later block with the extra keys; an id outside int64 takes the per-block encoding throughout,
    and a partial last block is left out."""
    tokens = list(range(100, 150))
    if big:
        tokens[20] = 2**64  # in the second block
    keys = hash_blocks(None, tokens, 16, (3,), algo, first_extra_keys=(3, "salt"))
    chain = [hash_block(None, tokens[:16], (3, "salt"), algo)]
    for i in range(1, len(tokens) // 16):
        chain.append(hash_block(chain[-1], tokens[16 * i : 16 * i + 16], (3,), algo))
    assert keys == chain and len(keys) == 3
    assert keys[1:] != hash_blocks(None, tokens, 16, (3,), algo)[1:]  # the first block's keys chain on


@pytest.mark.parametrize("algo", ["sha256", "builtin"])
def test_a_crafted_colliding_block_hits_only_under_builtin(algo):
    """A prompt whose first id is a victim's plus 2**61 - 1 is the victim's prompt to Python's hash: under builtin
    the look-up finds the victim's cached blocks (the probe vLLM's GHSA-rm76-4mrf-v9r8 describes); under sha256
    it finds none, while the victim's own prompt still hits."""
    manager = BlockManager(32, 4, hash_algo=algo)
    greedy = SamplingParams(max_tokens=1)
    victim = Request("victim", list(range(10, 22)) + [1], greedy)
    assert manager.allocate(victim, victim.num_tokens)
    manager.free(victim)
    crafted = Request("crafted", [10 + WRAP] + list(range(11, 22)) + [1], greedy)
    again = Request("again", list(range(10, 22)) + [2], greedy)
    assert len(manager.find_cached_prefix(again)) == 3
    assert len(manager.find_cached_prefix(crafted)) == (3 if algo == "builtin" else 0)


@pytest.mark.parametrize("algo", ["sha256", "builtin"])
def test_a_colliding_prompt_is_refused_and_ordinary_prefixes_still_hit(tiny_model_dirs, algo):
    """End to end, each algorithm: greedy output equal with and without a prefix hit, the hit counted; a prompt
    that collides with the cached prefix under Python's hash (an id past the vocabulary) is refused, as with no
    cache, since only sha256 lets the engine skip checking cached ids."""
    llm = LLM(str(tiny_model_dirs["llama"]), max_model_len=128, block_size=16, prefix_caching_hash_algo=algo)
    manager = llm.engine.block_manager
    assert manager.hash_algo == algo
    assert manager.keys_imply_equal_tokens == (algo == "sha256")
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prefix = list(range(3, 51))  # three whole blocks
    cold = llm.generate([prefix + [60, 61]], greedy, use_tqdm=False)[0]
    warm = llm.generate([prefix + [60, 61]], greedy, use_tqdm=False)[0]
    assert warm.num_cached_tokens == 48 and warm.outputs[0].token_ids == cold.outputs[0].token_ids
    with pytest.raises(ValueError, match=r"outside the vocabulary"):
        llm.generate([[prefix[0] + WRAP] + prefix[1:] + [60, 61]], greedy, use_tqdm=False)
    assert manager.num_free_blocks == manager.num_blocks and not manager._hashes


def test_the_flag_offers_the_algorithms_the_engine_has():
    """--prefix-caching-hash-algo's supported values are the key functions', sha256 (vLLM's default) first and
    default; its other choices are vLLM's newer names, refused by name (their keys are not computed here)."""
    flag = next(f for f in FLAGS if f.name == "--prefix-caching-hash-algo")
    assert flag.supported_values == get_args(HashAlgo) and flag.default == "sha256" == get_args(HashAlgo)[0]
    assert flag.choices is not None and set(flag.choices) - set(get_args(HashAlgo)) == {"sha256_cbor", "xxhash",
                                                                                          "xxhash_cbor"}


def test_the_schedulers_look_up_sees_what_changed_since_add_requests():
    """The blocks `cached_prompt_tokens` found at add_request serve the scheduler's look-up only while the index is
    unchanged: evicted since, the scheduler finds none (their ids hold other tokens now); indexed since (a prompt
    planned before it), it finds them."""
    greedy = SamplingParams(max_tokens=1)
    prompt = list(range(10, 22))
    manager = BlockManager(4, 4)
    first = Request("first", prompt + [1], greedy)
    assert manager.allocate(first, first.num_tokens)
    held = first.block_ids[:3]
    manager.free(first)  # its 3 full blocks stay cached
    hit = Request("hit", prompt + [2], greedy)
    assert manager.cached_prompt_tokens(hit) == 12
    same = Request("same", prompt + [3], greedy)
    assert manager.cached_prompt_tokens(same) == 12
    assert manager.find_cached_prefix(same) == held  # nothing changed: the blocks add_request found
    other = Request("other", list(range(100, 116)), greedy)
    assert manager.allocate(other, other.num_tokens)  # every block: the cached ones evicted
    assert manager.find_cached_prefix(hit) == []
    manager.free(other)
    late = Request("late", list(range(200, 212)) + [1], greedy)
    assert manager.cached_prompt_tokens(late) == 0
    again = Request("again", list(range(200, 212)) + [2], greedy)
    assert manager.allocate(again, again.num_tokens)  # planned first: its full blocks indexed
    assert len(manager.find_cached_prefix(late)) == 3
