"""The KV block pool: allocation, reference counts and automatic prefix caching.

Plain Python (no torch): it hands out block ids; the model runner owns the tensors they index.

Prefix caching works on full blocks. A full block's hash chains its parent's hash, its token ids
and extra keys (e.g. a LoRA id), so equal hashes mean equal whole prefixes (`block_hash`: by default
SHA-256, which no client can make collide). A block whose last user
finished keeps its hash and sits in the free queue; a later request with the same prefix takes it
back ("hit") instead of recomputing it. When a fresh block is needed, the least recently freed one is
evicted first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from flotilla.engine.block_hash import BlockHash, HashAlgo, hash_block, hash_blocks
from flotilla.engine.request import Request


@dataclass(eq=False)
class Block:
    """One KV block: `block_size` token slots in every layer's cache."""

    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None


class BlockManager:
    """Owns every block: which are free, who references which, and the prefix-cache index."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_algo: HashAlgo = "sha256") -> None:
        if num_blocks <= 0:
            raise ValueError("the KV cache needs at least one block")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_algo = hash_algo  # --prefix-caching-hash-algo
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (least recently freed first); cached ones keep their hash.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, int] = {}  # block hash -> block id
        self._hashes: dict[str, list[BlockHash]] = {}  # request id -> hashes of its full blocks
        self._num_indexed: dict[str, int] = {}  # request id -> how many of its blocks are indexed
        # Copy-on-write copies (source block, destination block) the runner must do before the next step.
        self.pending_copies: list[tuple[int, int]] = []
        self.prefix_cache_queries = 0  # tokens looked up (vllm:prefix_cache_queries)
        self.prefix_cache_hits = 0  # tokens found (vllm:prefix_cache_hits)

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request references (cached or not)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by requests (vllm:kv_cache_usage_perc)."""
        return 1.0 - len(self._free) / len(self.blocks)

    @property
    def keys_imply_equal_tokens(self) -> bool:
        """Whether two blocks with equal prefix-cache keys surely hold equal token ids (and extra keys).

        True for sha256 keys: no client can make them collide, so a prompt's blocks that the cache holds are the
        tokens the request that computed them sent, checked then (the engine skips checking them again). False for
        `builtin`: Python's hash of an int wraps modulo 2**61 - 1, so an id past the vocabulary can have a valid
        one's key (`block_hash`); every id must be checked."""
        return self.hash_algo == "sha256"

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, request: Request) -> list[int]:
        """Block ids holding the longest cached prefix of a request that has nothing computed yet.

        At least one token is always left to compute, since the step that computes it yields the
        next token's logits. Counts nothing: the caller records the look-up once the request is admitted
        (`record_lookup`).
        """
        return self._held_prefix(request) if self._may_hit(request) else []

    def record_lookup(self, request: Request, num_hit_blocks: int) -> None:
        """Count an admitted request's prefix-cache look-up in vllm:prefix_cache_queries / _hits. As vLLM (PR
        #48860), a look-up counts once, when its request is admitted: not at each step it waited for blocks before
        (each would count its tokens again), and not when a preempted request resumes (vLLM counts those apart, in
        counters no metric reads: its own blocks coming back are no hit for a client's prompt)."""
        if self._may_hit(request):
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_hit_blocks * self.block_size

    def fork_lookup(self, child: Request) -> int:
        """Count the look-up of a completion whose first token its leader's prompt gave (it forks now, or waits for
        a slot or for its preempted leader's blocks), and return the prompt tokens it found. vLLM runs a request's
        n completions as n requests, each looked up once: the prompt queried, and the cached full blocks found
        below its last token (recomputed to draw the first token); here the leader's, indexed as it computed them.
        Counted when the first token is drawn, so alike whether the child forks at once, waits, or ends on that
        token; its admission after is a resume, counted by neither."""
        if not self._may_hit(child):
            return 0
        found = len(self._held_prefix(child)) * self.block_size
        self.prefix_cache_queries += len(child.prompt_token_ids)
        self.prefix_cache_hits += found
        return found

    def cached_prompt_tokens(self, request: Request) -> int:
        """Tokens at the start of a new request's prompt whose blocks the prefix cache holds now, as
        `find_cached_prefix` would find them (0 when it would find none), counting no query. The request's block
        hashes computed for it are kept: the scheduler's look-up reuses them, `free` drops them."""
        return len(self._held_prefix(request)) * self.block_size if self._may_hit(request) else 0

    def _held_prefix(self, request: Request) -> list[int]:
        """Block ids of the longest run of the request's first blocks that the prefix cache holds, leaving at
        least one token to compute."""
        max_blocks = (request.num_tokens - 1) // self.block_size
        held: list[int] = []
        for block_hash in self._block_hashes(request, max_blocks)[:max_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            held.append(block_id)
        return held

    def _may_hit(self, request: Request) -> bool:
        """Whether a request may take blocks from the prefix cache. Prompt logprobs need every prompt position's
        logits, so such requests compute the whole prompt."""
        return self.enable_prefix_caching and request.sampling_params.prompt_logprobs is None

    def allocate(self, request: Request, num_new_tokens: int, cached_prefix: Sequence[int] = ()) -> bool:
        """Give `request` the blocks for `num_new_tokens` more tokens, after its cached prefix.

        Returns False, changing nothing, when the pool cannot supply them.
        """
        num_after = request.num_computed_tokens + len(cached_prefix) * self.block_size + num_new_tokens
        num_fresh = self.blocks_needed(num_after) - len(request.block_ids) - len(cached_prefix)
        copy = self._needs_copy_on_write(request)
        if num_fresh <= 0 and not copy and not cached_prefix:  # most decode steps: the last block has room
            self._cache_full_blocks(request, num_after)
            return True
        needed = num_fresh + copy
        # Cached blocks no request holds come back from the free queue too; counted (a pass over the blocks: ~125 of
        # them for a 2,000-token prefix hit, on its way to the first token) only when the pool might fall short.
        if needed + len(cached_prefix) > len(self._free):
            needed += sum(1 for b in cached_prefix if self.blocks[b].ref_count == 0)
            if needed > len(self._free):
                return False
        if copy:
            self._copy_last_block(request)
        blocks, free = self.blocks, self._free
        for block_id in cached_prefix:  # taken back from the free queue, or shared
            block = blocks[block_id]
            if block.ref_count == 0:
                del free[block_id]
            block.ref_count += 1
        request.block_ids.extend(cached_prefix)
        if cached_prefix and request.request_id not in self._num_indexed:
            self._num_indexed[request.request_id] = len(cached_prefix)  # found in the index: indexed already
        for _ in range(max(num_fresh, 0)):
            request.block_ids.append(self._take_fresh())
        self._cache_full_blocks(request, num_after)
        return True

    def fork(self, parent: Request, child: Request, num_tokens: int) -> None:
        """Let `child` share the blocks holding `parent`'s first `num_tokens` tokens (its prompt);
        writes will copy on demand. Blocks the parent took since, for a step already planned, stay its own."""
        shared = parent.block_ids[: self.blocks_needed(num_tokens)]
        for block_id in shared:
            self.blocks[block_id].ref_count += 1
        child.block_ids = list(shared)
        indexed = self._num_indexed.get(parent.request_id, 0)
        self._num_indexed[child.request_id] = min(indexed, num_tokens // self.block_size)

    def trim(self, request: Request, num_tokens: int) -> None:
        """Return the request's blocks beyond those holding its first `num_tokens` tokens (slots that
        held only rejected draft tokens: never hashed, so they go to the front of the eviction order)."""
        keep = self.blocks_needed(num_tokens)
        if len(request.block_ids) <= keep:
            return
        for block_id in reversed(request.block_ids[keep:]):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = None
                self._free.move_to_end(block.block_id, last=False)
        request.block_ids = request.block_ids[:keep]  # a new list: see `Request.block_ids`

    def uncache(self, request: Request, num_computed: int) -> None:
        """Drop the prefix-cache entries of the request's blocks from the one holding token `num_computed` on:
        they were indexed when a step was planned (as if computed) and that step will not compute them."""
        for block_id in request.block_ids[num_computed // self.block_size :]:
            self._unindex(self.blocks[block_id])

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write copies decided since the last call (for the model runner)."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, request: Request) -> None:
        """Drop the request's references; its blocks stay cached until evicted."""
        # Tail blocks are freed first so they are evicted first: prefixes are the valuable part. (127 blocks for a
        # 2,020-token request whose first token is its last: on its way to that token; the pool and queue local.)
        blocks, free = self.blocks, self._free
        for block_id in reversed(request.block_ids):
            block = blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                free[block_id] = None
        request.block_ids = []  # a new list: see `Request.block_ids`
        self._hashes.pop(request.request_id, None)
        self._num_indexed.pop(request.request_id, None)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (vLLM's reset_prefix_cache: after the KV cache's contents are discarded).
        Returns False, changing nothing, while any request holds a block."""
        if len(self._free) != len(self.blocks):
            return False
        for block in self.blocks:
            block.block_hash = None
        self._cached.clear()
        return True

    # --- internals ---------------------------------------------------------------------------------

    def _needs_copy_on_write(self, request: Request) -> bool:
        """True when the next token lands in a partly filled block that another request shares."""
        if request.num_computed_tokens % self.block_size == 0 or not request.block_ids:
            return False
        last = request.num_computed_tokens // self.block_size
        return last < len(request.block_ids) and self.blocks[request.block_ids[last]].ref_count > 1

    def _copy_last_block(self, request: Request) -> None:
        last = request.num_computed_tokens // self.block_size
        source = request.block_ids[last]
        self.blocks[source].ref_count -= 1
        blocks = list(request.block_ids)  # a new list: see `Request.block_ids`
        blocks[last] = self._take_fresh()
        request.block_ids = blocks
        self.pending_copies.append((source, blocks[last]))

    def _take_fresh(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        self._unindex(block)
        block.ref_count = 1
        return block_id

    def _unindex(self, block: Block) -> None:
        """Take a block's hash away, and its prefix-cache entry if the entry names it (a block filled with
        contents already cached keeps its hash without being the entry: `_cache_full_blocks`)."""
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) == block.block_id:
                del self._cached[block.block_hash]
            block.block_hash = None

    def _block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """Hashes of the request's full blocks (prompt and output), computed at least up to block
        `num_blocks` (or every full one, if fewer); each block is hashed once, as tokens arrive."""
        hashes = self._hashes.setdefault(request.request_id, [])
        size, algo = self.block_size, self.hash_algo
        # The adapter changes every layer's K/V: its id is part of each block's key.
        extra = (request.lora_request.lora_int_id,) if request.lora_request is not None else ()
        end = min(num_blocks, request.num_tokens // size)
        parent = hashes[-1] if hashes else None
        # The salt keys the first block only: every later hash chains it through its parent.
        first = extra + (request.cache_salt,) if request.cache_salt is not None else extra
        # Blocks wholly inside the prompt are hashed as one run over a slice of it, the first block's included: a
        # long prompt's blocks are hashed on the way to its first token (126 for 2,020 tokens). Later ones take
        # slices of the request's tokens, not `all_token_ids`: that copies the whole sequence each call.
        prompt = request.prompt_token_ids
        in_prompt = min(end, len(prompt) // size)
        if in_prompt > len(hashes):
            run = prompt[len(hashes) * size : in_prompt * size] if hashes or in_prompt * size < len(prompt) else prompt
            hashes += hash_blocks(parent, run, size, extra, algo, None if hashes else first)
            parent = hashes[-1]
        if not hashes and end > 0:  # a prompt shorter than a block: its first block holds output tokens
            parent = hash_block(None, request.token_ids(0, size), first, algo)
            hashes.append(parent)
        for i in range(len(hashes), end):
            parent = hash_block(parent, request.token_ids(i * size, (i + 1) * size), extra, algo)
            hashes.append(parent)
        return hashes

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Index the blocks that will be full once this step's tokens are computed."""
        if not self.enable_prefix_caching:
            return
        start = self._num_indexed.get(request.request_id, 0)
        end = num_tokens // self.block_size
        if end <= start:  # no block fills up in this step (most decode steps)
            return
        end = min(end, request.num_tokens // self.block_size)  # only blocks whose tokens all exist
        hashes = self._block_hashes(request, end)
        for i in range(start, end):
            block = self.blocks[request.block_ids[i]]
            if block.block_hash is None:
                block.block_hash = hashes[i]
                self._cached.setdefault(hashes[i], block.block_id)
        self._num_indexed[request.request_id] = max(start, end)
