"""The engine core's tokenizer handed to the API process (engine/tokenizer.py: `tokenizer_bytes`,
`tokenizer_from_bytes`): the copy behaves as a tokenizer loaded from the same path, and the API process's start-up
imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flotilla.engine.tokenizer import load_tokenizer, tokenizer_bytes, tokenizer_from_bytes

TEXTS = ["Hello, world!", "  two  spaces and\ttabs\n", "<|im_start|>user\nhi<|im_end|>", "naïve café 東京 🙂",
         "<think>marked</think> <tool_call>"]
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]


def behaviour(tokenizer: Any) -> dict[str, Any]:
    """What the server reads of a tokenizer: vocabulary, added and special tokens, template, encodings, decodings."""
    encoded = [tokenizer.encode(text) for text in TEXTS]
    return {
        "class": type(tokenizer).__name__,
        "vocab": tokenizer.get_vocab(),
        "len": len(tokenizer),
        "added": {i: (t.content, t.special) for i, t in tokenizer.added_tokens_decoder.items()},
        "special": tokenizer.special_tokens_map,
        "ids": (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id),
        "template": tokenizer.chat_template,
        "encoded": encoded,
        "plain": [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS],
        "decoded": [tokenizer.decode(ids) for ids in encoded],
        "skipped": [tokenizer.decode(ids, skip_special_tokens=True) for ids in encoded],
        "chat": tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        if tokenizer.chat_template else None,
    }


@pytest.fixture(scope="module")
def marked_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dirs: dict[str, Path]) -> Path:
    """The tiny models' tokenizer with added tokens, special and not (as Qwen3's `<think>`), saved again."""
    from tokenizers import AddedToken

    tokenizer = load_tokenizer(str(tiny_model_dirs["llama"]))
    tokenizer.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>"]})
    path = tmp_path_factory.mktemp("marked-tokenizer")
    tokenizer.save_pretrained(path)
    return path


def test_the_handed_over_tokenizer_behaves_as_the_loaded_one(tiny_model_dirs: dict[str, Path],
                                                             marked_tokenizer_dir: Path) -> None:
    for path in (str(tiny_model_dirs["qwen3"]), str(marked_tokenizer_dir)):
        loaded = load_tokenizer(path)
        data = tokenizer_bytes(loaded)
        assert data is not None
        assert behaviour(tokenizer_from_bytes(data, path)) == behaviour(loaded)


def test_a_gguf_files_tokenizer_is_handed_over_too() -> None:
    from flotilla.engine.embedded_model import embedded_gguf_path

    path = str(embedded_gguf_path())
    loaded = load_tokenizer(path)
    data = tokenizer_bytes(loaded)
    assert data is not None
    assert behaviour(tokenizer_from_bytes(data, path)) == behaviour(loaded)


def test_a_tokenizer_that_is_not_sent_or_does_not_unpickle_is_loaded(tiny_model_dirs: dict[str, Path]) -> None:
    path = str(tiny_model_dirs["llama"])
    assert tokenizer_bytes(object()) is None  # not transformers' own: the API process loads its own
    expected = behaviour(load_tokenizer(path))
    assert behaviour(tokenizer_from_bytes(None, path)) == expected
    assert behaviour(tokenizer_from_bytes(b"not a pickle", path)) == expected


# What the API process does before it serves, in a fresh interpreter: import the server, build the engine's
# configuration for the model (device auto), take the core's tokenizer.
_API_START = """
import pickle, sys
from flotilla.engine.server import cli
from flotilla.engine.config import EngineConfig
from flotilla.engine.tokenizer import import_tokenizer_classes, tokenizer_from_bytes
config = EngineConfig.from_kwargs(sys.argv[1])
import_tokenizer_classes()
tokenizer = tokenizer_from_bytes(open(sys.argv[2], "rb").read(), config.model.tokenizer)
print(config.device.device,
      sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_the_api_process_starts_without_torch(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    import torch

    path = str(tiny_model_dirs["llama"])
    data = tokenizer_bytes(load_tokenizer(path))
    assert data is not None
    (tmp_path / "tokenizer.pickle").write_bytes(data)
    out = subprocess.run([sys.executable, "-c", _API_START, path, str(tmp_path / "tokenizer.pickle")],
                         capture_output=True, text=True, timeout=120, check=True).stdout.split(maxsplit=1)
    device, torch_modules = out[0], json.loads(out[1].replace("'", '"'))
    assert device == ("cuda" if torch.cuda.is_available() else "cpu")  # what torch answers, without torch
    if torch.version.cuda is None and torch.version.hip is None:  # a CUDA build's API process asks torch itself
        assert torch_modules == []


def test_the_build_read_from_torch_version_is_torchs() -> None:
    import torch

    from flotilla.engine.config import _torch_built_for_gpu

    assert _torch_built_for_gpu() == (torch.version.cuda is not None or torch.version.hip is not None)
