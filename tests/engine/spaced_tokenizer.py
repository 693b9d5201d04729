"""A real WordPiece tokenizer (BERT's decoder: a space before every token but a `##` piece), the kind whose
decoded special tokens are spaced apart, for the `spaces_between_special_tokens` tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# [PAD], [BOS], [EOS] at the tiny models' pad, bos and eos ids (tests/conftest.py)
SPECIAL = ["[PAD]", "[BOS]", "[EOS]", "[UNK]", "[A]", "[B]"]
WORDS = ["hello", "world", "ships", "sail", "##s", "##ed"]


def wordpiece_tokenizer() -> Any:
    """The tokenizer, as transformers loads it (special tokens [A] and [B] are ids 4 and 5)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(SPECIAL + WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", bos_token="[BOS]",
                                   eos_token="[EOS]", unk_token="[UNK]", additional_special_tokens=["[A]", "[B]"])


def with_wordpiece_tokenizer(model_dir: Path, into: Path) -> Path:
    """A copy of a tiny model's folder whose tokenizer is the WordPiece one."""
    import shutil

    shutil.copytree(model_dir, into, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json",
                                                                    "vocab.json", "merges.txt"))
    wordpiece_tokenizer().save_pretrained(into)
    return into
