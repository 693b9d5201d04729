"""Loading the tokenizer and the model's end-of-sequence ids."""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def load_tokenizer(path: str) -> Any:
    """The HF tokenizer in `path` (fast when available), with its chat template; a `.gguf` file's own (transformers
    rebuilds it from the file's metadata)."""
    from transformers import AutoTokenizer

    if path.endswith(".gguf") and Path(path).is_file():
        return AutoTokenizer.from_pretrained(Path(path).parent, gguf_file=Path(path).name)
    return AutoTokenizer.from_pretrained(path)


def tokenizer_bytes(tokenizer: Any) -> bytes | None:
    """`tokenizer` pickled: the engine core hands the API process its copy so (the fast tokenizer pickles as its
    Rust tokenizer's JSON plus the Python attributes: added and special tokens, chat template), and an in-process
    engine gets its own copy of the server's so. None for a tokenizer that is not transformers' own or does not
    pickle: the other side then loads its own."""
    if not type(tokenizer).__module__.startswith("transformers."):
        return None
    try:
        return pickle.dumps(tokenizer, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an attribute that does not pickle: the API process loads its own
        logger.debug("the tokenizer does not pickle: it is loaded again where it is needed", exc_info=True)
        return None


def import_tokenizer_classes() -> None:
    """Import transformers' fast-tokenizer module, the one unpickling the engine core's tokenizer imports (its
    class or its base; no torch): the API process does it while the core loads the tokenizer, not after."""
    import transformers.tokenization_utils_tokenizers  # noqa: F401


def tokenizer_from_bytes(data: bytes | None, path: str) -> Any:
    """The tokenizer `tokenizer_bytes` pickled (the engine core's copy for the API process), or when there is none
    or it does not unpickle here, `load_tokenizer(path)`. Unpickling imports only the tokenizer's own class
    (transformers' fast tokenizer: no torch), where `AutoTokenizer` imports the model configuration stack and
    torch: about 0.7 s of CPU instead of 3.3 s for the tests' tiny models."""
    if data is not None:
        try:
            return pickle.loads(data)
        except Exception:  # tokenizer_bytes could not check what unpickles in this process
            logger.warning("the pickled tokenizer did not unpickle: loading it again", exc_info=True)
    return load_tokenizer(path)


def eos_token_ids(model_dir: str, tokenizer: Any, hf_config: dict[str, Any]) -> frozenset[int]:
    """Every id that ends a sequence: the tokenizer's and the generation config's, as in vLLM. The generation config
    is `model_dir`'s generation_config.json, or when there is none config.json's (transformers'
    `GenerationConfig.from_model_config`): with the file there, config.json's eos_token_id stops neither HF
    `generate` nor vLLM."""
    ids: set[int] = set()
    gen_path = Path(model_dir) / "generation_config.json"
    generation = json.loads(gen_path.read_text()) if gen_path.is_file() else hf_config
    sources = [generation.get("eos_token_id"), tokenizer.eos_token_id]
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def longest_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token of `tokenizer` stands for.

    The length of the longest vocabulary entry: byte-level BPE spells each byte as one character and
    SentencePiece spells each character as one, so an entry is at least as long as the text it
    decodes to. A text of more than `max_model_len * longest_token_chars` characters therefore
    tokenizes to more than `max_model_len` tokens, and can be refused without tokenizing it.
    """
    return max((len(piece) for piece in tokenizer.get_vocab()), default=1)


def decoder_without_gil(tokenizer: Any) -> Callable[[list[int]], str]:
    """A `tokenizer.decode(ids)` that other threads can run beside: the fast tokenizer's Rust `decode` holds the
    GIL throughout (1.3M ids: ~0.8 s in which no other thread runs), its `decode_batch` releases it.

    Taken only where the result is the same: transformers returns the Rust decoder's text unchanged unless it
    cleans up tokenization spaces, which the probe (text that the cleanup would change) detects; elsewhere
    (a slow tokenizer, cleanup on) `tokenizer.decode` itself.
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "decode_batch"):
        return tokenizer.decode
    probe = backend.encode("a , b . c ? d ! e 's f n't", add_special_tokens=False).ids
    if tokenizer.decode(probe) != backend.decode(probe, skip_special_tokens=False):
        return tokenizer.decode
    return lambda ids: backend.decode_batch([ids], skip_special_tokens=False)[0]
