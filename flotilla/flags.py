"""The engine's command-line contract, declared once.

Both the engine's CLI (which builds its argument parser from this table) and the operator (which
turns an InferenceService spec into engine arguments, and refuses spec fields whose flag is not
implemented yet) read this module. It imports nothing but the standard library, so the operator's
image stays free of torch.

Flag names and meanings mirror `vllm serve`, so users' muscle memory carries over.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

FlagType = Literal["str", "int", "float", "bool", "json", "list"]
Component = Literal["model", "cache", "scheduler", "parallel", "speculative", "structured_outputs", "lora", "server",
                    "device"]


@dataclass(frozen=True)
class Flag:
    """One engine flag: its CLI name, type, default and which InferenceService field sets it.

    `implemented` is False for flags that are declared (so the contract is complete) but not yet
    honoured by the engine; the engine refuses them with a clear error and so does the operator's
    webhook. `supported_values`, when set, restricts an implemented flag to the values that work
    today (e.g. tensor parallel size 1 until tensor parallelism lands).
    """

    name: str
    type: FlagType
    default: Any
    help: str
    component: Component
    crd_field: str | None = None
    implemented: bool = True
    choices: tuple[Any, ...] | None = None
    supported_values: tuple[Any, ...] | None = None
    env: str | None = None
    negatable: bool = False
    aliases: tuple[str, ...] = field(default_factory=tuple)
    # Inclusive range bounds of int/float flags (gt: exclusive lower bound), as pydantic's Field.
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    # An int flag that also takes vLLM's human-readable forms (`32k`, `1K`; `human_readable_int`).
    human_readable: bool = False
    # Why a vLLM value cannot be honoured here (a flag not implemented, or a value outside supported_values): the
    # refusal says so instead of "not implemented yet".
    refusal: str | None = None

    @property
    def dest(self) -> str:
        """The Python attribute name argparse gives this flag (`--max-model-len` -> `max_model_len`)."""
        return self.name.lstrip("-").replace("-", "_")

    def check_value(self, value: Any) -> str | None:
        """Return an error message if `value` cannot be used today, else None."""
        if value is None or value == self.default:
            return None
        if not self.implemented:
            if self.refusal:
                return f"{self.name} is not supported: {self.refusal}"
            return f"{self.name} is not implemented yet in this Flotilla version"
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(str(c) for c in self.choices)
            return f"{self.name}={value!r} is not one of: {allowed}"
        if self.supported_values is not None and value not in self.supported_values:
            allowed = ", ".join(str(c) for c in self.supported_values)
            reason = f": {self.refusal}" if self.refusal else ""
            return f"{self.name}={value!r} is not supported yet (supported: {allowed}){reason}"
        return self._type_problem(value) or self._range_problem(value)

    def _type_problem(self, value: Any) -> str | None:
        numeric = {"int": (int,), "float": (int, float)}.get(self.type)
        if numeric and (isinstance(value, bool) or not isinstance(value, numeric)):
            return f"{self.name}={value!r} is not a{'n' if self.type == 'int' else ''} {self.type}"
        if numeric and not math.isfinite(value):
            return f"{self.name}={value!r} is not a finite number"
        return None

    def _range_problem(self, value: Any) -> str | None:
        if self.type not in ("int", "float"):
            return None
        if (self.ge is not None and value < self.ge) or (self.gt is not None and value <= self.gt) or \
                (self.le is not None and value > self.le):
            return f"{self.name}={value!r} is out of range ({self.range_text})"
        return None

    @property
    def range_text(self) -> str:
        """The declared range in words (`>= 1`, `> 0 and <= 1`), empty when none."""
        bounds = [f"{op} {bound:g}" for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le))
                  if bound is not None]
        return " and ".join(bounds)


_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")


def json_value(text: str) -> Any:
    """A JSON flag value's text parsed; ValueError for any bad JSON, nesting deeper than Python's recursion limit too
    (json.loads raises RecursionError there, which argparse, the webhook and the engine's checks would not catch: a
    value of 5,000 '[' must be refused like other bad JSON, not crash them)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def human_readable_int(text: str, name: str = "--max-model-len") -> int:
    """An int as `vllm serve` reads --max-model-len and --max-num-batched-tokens (`name`, the flag being read):
    plain (`8192`), or with a lower-case suffix in powers of 1,000 (`32k` = 32,000, `25.6k` = 25,600) or an
    upper-case one in powers of 1,024 (`32K` = 32,768; whole numbers only). ValueError for anything else,
    and for --max-model-len's `auto` / -1, which vLLM takes (the longest context the KV cache holds after memory
    profiling) but this engine cannot honour before it has profiled."""
    if name == "--max-model-len" and (text.strip() == "-1" or text.strip().lower() == "auto"):
        raise ValueError(f"{text.strip()} (vLLM's --max-model-len auto: the longest context the KV cache holds after "
                         "memory profiling) is not supported yet: give a number, or leave --max-model-len out for the "
                         "model's own limit")
    if re.fullmatch(r"-\d+", text.strip()):
        return int(text)  # a negative number: the flag's range refuses it, naming the range
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None or ("." in match[1] and not match[2]):  # a plain fraction (`0.5`) is no integer either
        raise ValueError(f"{text!r} is not an integer (nor one like 32k = 32,000 or 32K = 32,768)")
    number, suffix = match.groups()
    if suffix in _DECIMAL_SUFFIXES:
        return int(float(number) * _DECIMAL_SUFFIXES[suffix])
    if "." in number:
        raise ValueError(f"{text!r}: a fraction takes a decimal suffix (k, m, g, t), not a binary one")
    return int(number) * _BINARY_SUFFIXES.get(suffix, 1)


# Why vLLM's Hub download flags are refused (--revision, --tokenizer-revision, --download-dir).
LOCAL_ONLY = ("Flotilla loads the model and tokenizer from local directories only (the operator downloads "
              "spec.model.source into the pod)")

FLAGS: tuple[Flag, ...] = (
    # --- model -----------------------------------------------------------------------------------
    Flag(
        "--served-model-name",
        "list",
        None,
        "Model name(s) the API answers to (default: the model path).",
        "model",
        crd_field="model.servedName",
    ),
    Flag(
        "--trust-remote-code",
        "bool",
        False,
        "vLLM's permission to run a checkpoint's own Python code (config.json's auto_map). Accepted so that vLLM "
        "commands carry over, but Flotilla never runs a checkpoint's code: it serves its built-in architectures, "
        "and a model whose config.json needs custom code for any other is refused at start-up, with or without "
        "this flag.",
        "model",
        negatable=True,
    ),
    Flag("--tokenizer", "str", None, "Tokenizer directory (default: the model directory).", "model",
         crd_field="model.tokenizer"),
    Flag(
        "--tokenizer-mode",
        "str",
        "auto",
        "Which tokenizer implementation (vLLM's flag): auto and hf load the Hugging Face tokenizer as vLLM does "
        "for a model without Mistral's own format (the fast one where the model has one); slow (always the "
        "Python tokenizer), mistral (mistral_common's files) and custom are refused.",
        "model",
        choices=("auto", "hf", "slow", "mistral", "custom"),
        supported_values=("auto", "hf"),
        refusal="the tokenizer is loaded only as vLLM's auto and hf modes load it (Hugging Face's, fast where the "
                "model has one)",
    ),
    Flag(
        "--revision",
        "str",
        None,
        "vLLM's Hub branch, tag or commit of the model to download: refused, since " + LOCAL_ONLY + ".",
        "model",
        implemented=False,
        refusal="it picks a Hugging Face Hub version to download, and " + LOCAL_ONLY + "; give the directory of "
                "that revision as MODEL",
    ),
    Flag(
        "--tokenizer-revision",
        "str",
        None,
        "vLLM's Hub version of the tokenizer to download: refused, since " + LOCAL_ONLY + ".",
        "model",
        implemented=False,
        refusal="it picks a Hugging Face Hub version of the tokenizer to download, and " + LOCAL_ONLY + "; give "
                "that revision's directory as --tokenizer",
    ),
    Flag(
        "--download-dir",
        "str",
        None,
        "vLLM's directory to download Hub weights into: refused, since " + LOCAL_ONLY + ".",
        "model",
        implemented=False,
        refusal="it is where vLLM downloads Hub weights, and " + LOCAL_ONLY,
    ),
    Flag(
        "--dtype",
        "str",
        "auto",
        "Weight and activation dtype; auto takes the checkpoint's "
        "(float16 checkpoints stay float16); a float32 checkpoint runs in bfloat16 on the GPU (float16 for a pooling "
        "model), as vLLM, and stays float32 on the CPU.",
        "model",
        crd_field="dtype",
        choices=("auto", "bfloat16", "float16", "float32", "half", "float", "bf16"),
    ),
    Flag(
        "--max-model-len",
        "int",
        None,
        "Maximum tokens per sequence, prompt plus output (default: the model's max_position_embeddings).",
        "model",
        crd_field="scheduling.maxModelLen",
        ge=1,
        human_readable=True,
    ),
    Flag("--seed", "int", 0, "Seed for random sampling of requests that give no seed of their own.", "model"),
    Flag(
        "--quantization",
        "str",
        None,
        "Weight quantization method: fp8 quantizes a bf16/fp16 checkpoint at load (per-channel e4m3 "
        "weights, dynamic per-token activations); rtn rounds a checkpoint's weights to nearest at load, "
        "weight-only (RTN_NUM_BITS 8 or 4, default 8; RTN_GROUP_SIZE inputs per scale, default 128, -1 per "
        "row); bitsandbytes quantizes a checkpoint's weights to nf4 in blocks of 64 at load, or serves a bitsandbytes "
        "4-bit (nf4 / fp4) checkpoint; awq, gptq, compressed-tensors, modelopt (NVIDIA ModelOpt FP8) and fbgemm_fp8 "
        "(Meta's FP8) name a pre-quantized checkpoint's format, which is also detected from its config.json without "
        "the flag (gptq_marlin and awq_marlin, vLLM's kernel names, name gptq and awq); gguf serves a "
        ".gguf model file's weights, Q4_0/Q4_1/Q4_K as their 4-bit codes, the other common types (Q5_*, "
        "Q2_K/Q3_K/Q5_K/Q6_K, Q8_0) dequantized (implied by a .gguf model; with no model, the "
        "embedded model's own Q4_1 GGUF).",
        "model",
        crd_field="quantization",
        choices=("fp8", "int8", "rtn", "awq", "gptq", "compressed-tensors", "gguf", "bitsandbytes", "modelopt",
                 "fbgemm_fp8", "gptq_marlin", "awq_marlin"),
        supported_values=("fp8", "rtn", "awq", "gptq", "compressed-tensors", "gguf", "bitsandbytes", "modelopt",
                          "fbgemm_fp8", "gptq_marlin", "awq_marlin"),
    ),
    Flag(
        "--hf-overrides",
        "json",
        None,
        "Keys set over the model's config.json before anything is built from it (vLLM's flag), as a JSON object, "
        'e.g. {"max_position_embeddings": 8192} or {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, '
        '"original_max_position_embeddings": 2048}}: each key replaces config.json\'s value whole (an object too, '
        "as vLLM sets rope_scaling) or adds a key config.json lacks; the architecture, the length limit "
        "(default --max-model-len), the layers built and the pooling's matryoshka keys all read the result. A key the "
        "engine reads must have a value it can run (a positive integer size, true/false flags, no more layers than "
        "the checkpoint's, no change to a weight's shape); the error names the key.",
        "model",
    ),
    Flag("--enforce-eager", "bool", False, "Never capture CUDA graphs.", "model", negatable=True),
    Flag(
        "--enable-sleep-mode",
        "bool",
        False,
        "Let the engine sleep (`LLM.sleep`, and POST /sleep with VLLM_SERVER_DEV_MODE=1): level 1 moves the weights "
        "to host memory and frees the KV cache, level 2 frees both; wake_up restores them. One tensor and pipeline "
        "rank only.",
        "model",
    ),
    Flag(
        "--max-cudagraph-capture-size",
        "int",
        None,
        "The most tokens a step replayed from a CUDA graph holds (vLLM's flag): decode steps of more rows "
        "and prefill/extend steps of more tokens run eagerly. Default: decode graphs up to --max-num-seqs "
        "rows and mixed (prefill beside decodes) graphs up to 512 tokens. Larger values capture more mixed "
        "graphs (start-up time, a little memory), so steps of many decodes plus a short prefill replay "
        "a graph instead of launching every kernel from Python.",
        "model",
        ge=1,
    ),
    Flag(
        "--compilation-config",
        "json",
        None,
        "vLLM's compilation settings, as JSON; what maps onto CUDA graphs here (nothing is compiled with "
        "torch.compile: graphs capture whole steps, as vLLM's full graphs): cudagraph_capture_sizes (exactly these "
        "sizes: decode steps of up to that many rows, mixed steps of up to that many tokens), "
        "max_cudagraph_capture_size (as the flag), cudagraph_mode NONE (no graphs), FULL or FULL_AND_PIECEWISE "
        "(graphs), level/mode 0 (no compilation, so no graphs) or 3 (the graphs). Any other key is a usage error "
        "naming it.",
        "model",
        aliases=("-cc",),
    ),
    Flag(
        "--optimization-level",
        "int",
        2,
        "vLLM's -O: 0 compiles nothing and captures no CUDA graphs (as --enforce-eager); 2 (vLLM's default) and 3 "
        "capture the engine's whole-step graphs, vLLM's FULL_AND_PIECEWISE at those levels (there is no "
        "torch.compile to tune). 1 is PIECEWISE graphs in vLLM, which do not exist here: it captures the same graphs "
        "as 2, and the start-up log says so. A --compilation-config key wins over the level, as in vLLM.",
        "model",
        aliases=("-O",),
        choices=(0, 1, 2, 3),
    ),
    Flag(
        "--load-format",
        "str",
        "auto",
        "How to get the weights: auto reads the safetensors (or the .gguf file), and so does safetensors, vLLM's name "
        "for it (refused for a .gguf model); dummy fills random weights on the device (benchmarks of a model's shape "
        "without its checkpoint, as vLLM's --load-format dummy).",
        "model",
        choices=("auto", "safetensors", "dummy"),
    ),
    Flag(
        "--generation-config",
        "str",
        "auto",
        "Where requests' default sampling fields come from (as vLLM): auto reads the model's "
        "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty; max_new_tokens as "
        "the default max_tokens) for requests that leave them out; vllm keeps the neutral defaults; a folder "
        "reads its generation_config.json.",
        "model",
    ),
    Flag(
        "--override-generation-config",
        "json",
        None,
        "Default sampling fields set over --generation-config's (as vLLM), as a JSON object with "
        'generation_config.json\'s names, e.g. {"temperature": 0.5, "max_new_tokens": 256}: repetition_penalty, '
        "temperature, top_k, top_p, min_p, max_new_tokens (the default max_tokens) apply; other keys are ignored. "
        "Also with --generation-config vllm.",
        "model",
    ),
    Flag(
        "--logprobs-mode",
        "str",
        "raw_logprobs",
        "What `logprobs` report (vLLM's flag and names): raw_logprobs (default) and raw_logits are the model's "
        "own, before logit_bias, min_tokens, penalties, allowed_token_ids and bad_words; processed_logprobs and "
        "processed_logits are those the draw uses, after them and (sampled rows) after temperature, min_p, "
        "top_k and top_p. The *_logits modes report the logits themselves instead of their log-softmax.",
        "model",
        choices=("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"),
    ),
    Flag(
        "--max-logprobs",
        "int",
        20,
        "The most logprobs a request may ask for per token (completions' logprobs, chat's and the Responses API's "
        "top_logprobs, prompt_logprobs), as vLLM's: a request asking for more gets a 400; -1 (or a number above "
        "the vocabulary size) allows up to the vocabulary size (a request's logprob entries in all stay bounded "
        "either way).",
        "model",
        ge=-1,
    ),
    # --- pooling runner (engine/pooling, /v1/embeddings) -------------------------------------------
    Flag(
        "--runner",
        "str",
        "auto",
        "Which runner serves the model: generate (text generation) or pooling (prefill only: embeddings on "
        "/v1/embeddings, or a classifier's /classify and cross-encoder /score and /rerank); auto picks pooling for "
        "*Model / *EmbeddingModel / *ForTextEncoding / *ForSequenceClassification architectures, else generate (as "
        "vLLM).",
        "model",
        crd_field="runner",
        choices=("auto", "generate", "pooling", "draft"),
        supported_values=("auto", "generate", "pooling"),
    ),
    Flag(
        "--convert",
        "str",
        "auto",
        "How the pooling runner adapts a checkpoint: embed (last-token pooling, L2 normalised) or classify "
        "(a score head on the last token: checkpoint's score.weight, or config.json's classifier_from_token); auto "
        "means classify for *ForSequenceClassification, embed for other architectures with --runner pooling, "
        "none otherwise (as vLLM).",
        "model",
        choices=("auto", "none", "embed", "classify", "reward"),
        supported_values=("auto", "none", "embed", "classify"),
    ),
    Flag(
        "--task",
        "str",
        "auto",
        "vLLM's older spelling (deprecated there): embed/embedding = --runner pooling --convert embed, classify = "
        "--runner pooling --convert classify, score = either by the architecture (classify for "
        "*ForSequenceClassification), generate = --runner generate.",
        "model",
        choices=("auto", "generate", "embedding", "embed", "classify", "score", "reward"),
        supported_values=("auto", "generate", "embedding", "embed", "classify", "score"),
    ),
    # --- KV cache ----------------------------------------------------------------------------------
    Flag(
        "--block-size",
        "int",
        16,
        "Tokens per KV-cache block.",
        "cache",
        crd_field="kvCache.blockSize",
        choices=(8, 16, 32, 64, 128),
    ),
    Flag(
        "--gpu-memory-utilization",
        "float",
        0.9,
        "Fraction of GPU memory the engine may use (weights + activations + KV cache).",
        "cache",
        crd_field="kvCache.gpuMemoryUtilization",
        gt=0,
        le=1,
    ),
    Flag(
        "--kv-cache-dtype",
        "str",
        "auto",
        "KV-cache dtype (auto = the model dtype; fp8 = fp8_e4m3: one byte per element, with per-layer "
        "k/v scales from the checkpoint or 1.0).",
        "cache",
        crd_field="kvCache.dtype",
        choices=("auto", "fp8", "fp8_e4m3"),
    ),
    Flag(
        "--calculate-kv-scales",
        "bool",
        False,
        "With --kv-cache-dtype fp8: compute each layer's k/v scales (max |K| / 200, max |V| / 100, as vLLM) "
        "from a calibration forward at start-up instead of 1.0 where the checkpoint has none.",
        "cache",
        crd_field="kvCache.calculateScales",
    ),
    Flag("--num-gpu-blocks-override", "int", None, "Fix the number of KV blocks (tests, benchmarks).", "cache", ge=1),
    Flag(
        "--enable-prefix-caching",
        "bool",
        True,
        "Automatic prefix caching over full KV blocks.",
        "cache",
        crd_field="kvCache.prefixCaching",
        negatable=True,
    ),
    Flag(
        "--prefix-caching-hash-algo",
        "str",
        "sha256",
        "How a full KV block's prefix-cache key is computed: sha256 (collision-resistant: SHA-256 over the "
        "parent's key, the block's token ids and extra keys, from a random per-process root) or builtin (Python's "
        "hash: faster, but a client can craft a block that collides with another prompt's and read its cached "
        "K/V; trusted single-tenant clients only; vLLM's earlier choice). vLLM's sha256_cbor, xxhash and "
        "xxhash_cbor are refused: their keys are not computed here.",
        "cache",
        choices=("sha256", "builtin", "sha256_cbor", "xxhash", "xxhash_cbor"),
        supported_values=("sha256", "builtin"),
    ),
    # --- scheduler ---------------------------------------------------------------------------------
    Flag(
        "--max-num-seqs", "int", 256, "Maximum sequences in one step.", "scheduler", crd_field="scheduling.maxNumSeqs",
        ge=1,
    ),
    Flag(
        "--max-num-batched-tokens",
        "int",
        None,
        "Token budget of one step (default: 8192, or max-model-len when larger and chunked prefill is off).",
        "scheduler",
        crd_field="scheduling.maxNumBatchedTokens",
        ge=1,
        human_readable=True,
    ),
    Flag(
        "--enable-chunked-prefill",
        "bool",
        False,
        "Split long prompts over several steps.",
        "scheduler",
        crd_field="scheduling.chunkedPrefill",
        negatable=True,
    ),
    Flag(
        "--async-scheduling",
        "bool",
        None,
        "Schedule and launch the next step while the GPU still runs the current one (its drawn tokens "
        "feed the next step on the device). Default: on with CUDA, off on the CPU, where there is "
        "nothing to overlap.",
        "scheduler",
        negatable=True,
    ),
    Flag(
        "--scheduling-policy",
        "str",
        "fcfs",
        "Order of waiting requests: fcfs (arrival), or priority (a request's `priority` field, lower "
        "first, then arrival; the running request with the largest is preempted first).",
        "scheduler",
        choices=("fcfs", "priority"),
    ),
    # --- parallelism -------------------------------------------------------------------------------
    Flag(
        "--tensor-parallel-size",
        "int",
        1,
        "Tensor-parallel ranks: one worker process per GPU, each holding a slice of every layer.",
        "parallel",
        crd_field="parallelism.tensor",
        aliases=("-tp",),
        ge=1,
    ),
    Flag(
        "--pipeline-parallel-size",
        "int",
        1,
        "Pipeline stages: the layers split over this many workers (x the tensor-parallel size).",
        "parallel",
        crd_field="parallelism.pipeline",
        aliases=("-pp",),
        ge=1,
    ),
    Flag(
        "--data-parallel-size",
        "int",
        1,
        "Engine copies in one server (vLLM's data parallelism): 1 here.",
        "parallel",
        aliases=("-dp",),
        ge=1,
        supported_values=(1,),
        refusal="one server runs one engine; for more copies of the model run more replicas "
                "(an InferenceService's spec.replicas, or more pods behind one Service)",
    ),
    Flag(
        "--distributed-executor-backend",
        "str",
        None,
        "How tensor/pipeline ranks run: mp, one spawned worker process per rank (what runs here at -tp/-pp above "
        "1); uni, the model in the engine core's own process, one rank (what runs here at -tp 1 -pp 1, so only "
        "there; mp there runs the same way).",
        "parallel",
        choices=("mp", "ray", "uni", "external_launcher"),
        supported_values=("mp", "uni"),
        refusal="Flotilla runs every tensor/pipeline rank as a worker process it spawns on this host (vLLM's mp); "
                "there is no Ray or external launcher here",
    ),
    Flag(
        "--disable-custom-all-reduce",
        "bool",
        False,
        "Accepted as vLLM's: the tensor-parallel all-reduce here is always NCCL's (torch.distributed; gloo on the "
        "CPU), never a custom kernel, so this changes nothing.",
        "parallel",
    ),
    # --- speculative decoding, LoRA --------------------------------------------------------------
    Flag(
        "--speculative-config",
        "json",
        None,
        'Speculative decoding, as JSON with vLLM\'s keys: {"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_max": 5, "prompt_lookup_min": 2} or {"model": "<draft dir>", "num_speculative_tokens": 4}; '
        'optional "disable_by_batch_size".',
        "speculative",
        crd_field="speculative",
    ),
    Flag(
        "--structured-outputs-config",
        "json",
        None,
        'Structured output for every request, as JSON with vLLM\'s keys: {"backend": "xgrammar", '
        '"disable_any_whitespace": true} compiles JSON schemas and tool-call grammars to compact JSON (no '
        "free whitespace, which small models can loop on); backend auto or xgrammar. Flotilla's own key "
        '"compile_timeout_s" (10) bounds a grammar\'s compile, which runs off the step loop: past it the '
        "request is a 400 (a 503 if its compile could not start: slow compiles held every thread). With a "
        'reasoning parser ("reasoning_parser", or --reasoning-parser) a grammar starts after </think>; '
        '"enable_in_reasoning": true applies it from the first token.',
        "structured_outputs",
    ),
    Flag(
        "--enable-lora",
        "bool",
        False,
        "Serve LoRA adapters (PEFT format, on q/k/v/o/gate/up/down): a request picks one by its `model`; "
        "base-model requests and several adapters run in one batch.",
        "lora",
        crd_field="lora",
    ),
    Flag(
        "--lora-modules",
        "list",
        None,
        'Adapters served from the start: name=path, or JSON {"name": ..., "path": ..., "base_model_name": ...}.',
        "lora",
        crd_field="lora.adapters",
    ),
    Flag("--max-loras", "int", 1, "Adapters in one batch (device slots).", "lora", crd_field="lora.maxLoras", ge=1),
    Flag(
        "--max-lora-rank",
        "int",
        16,
        "Largest adapter rank served (sizes the device slots).",
        "lora",
        crd_field="lora.maxLoraRank",
        choices=(1, 8, 16, 32, 64, 128, 256, 320, 512),
    ),
    Flag(
        "--max-cpu-loras",
        "int",
        None,
        "Adapters kept loaded in CPU memory (default and minimum: --max-loras).",
        "lora",
        crd_field="lora.maxCpuLoras",
        ge=1,
    ),
    # --- device ------------------------------------------------------------------------------------
    Flag(
        "--device",
        "str",
        "auto",
        "Where to run: auto picks CUDA when present, else the CPU.",
        "device",
        choices=("auto", "cuda", "cpu"),
    ),
    Flag(
        "--triton-gemv-max-rows",
        "int",
        1,
        "Flotilla's own (not a vllm serve flag): on CUDA, linear layers of at most this many rows (and at "
        "most 8192 output features) use the Triton GEMV instead of cuBLAS, where it measured faster "
        "(decode at batch 1); 0 keeps cuBLAS throughout.",
        "device",
        ge=0,
        le=8,  # the kernel is built and measured for 1-8 rows
    ),
    # --- server ------------------------------------------------------------------------------------
    Flag("--host", "str", None, "Address to listen on (default: all).", "server"),
    Flag("--disable-log-stats", "bool", False, "Do not log the periodic stats line.", "server"),
    Flag(
        "--enable-log-requests",
        "bool",
        False,
        "Log a line when a generation or embedding request reaches the engine (its id, parameters and LoRA "
        "adapter) and one when it finishes, fails or is aborted; its prompt text and token ids at DEBUG only "
        "(VLLM_LOGGING_LEVEL=DEBUG), as vLLM; off by default, as in vLLM.",
        "server",
        negatable=True,
    ),
    Flag(
        "--disable-log-requests",
        "bool",
        False,
        "vLLM's older spelling (deprecated there since --enable-log-requests): requests are not logged, which is "
        "the default; refused together with --enable-log-requests. Negatable, as vLLM's: --no-disable-log-requests "
        "is the default too.",
        "server",
        negatable=True,
    ),
    Flag(
        "--max-log-len",
        "int",
        None,
        "With --enable-log-requests: the most prompt characters and prompt token ids a request's log line holds "
        "(vLLM's flag; each prompt of an embeddings batch cut alike); default: all of them.",
        "server",
        ge=0,
    ),
    Flag(
        "--disable-uvicorn-access-log",
        "bool",
        False,
        "No uvicorn access log line per HTTP request (vLLM's flag). By default each request leaves one on stdout, "
        "as in vLLM: INFO:     127.0.0.1:5555 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK (at --uvicorn-log-level "
        "info or lower).",
        "server",
        negatable=True,
    ),
    Flag(
        "--disable-access-log-for-endpoints",
        "str",
        None,
        "No uvicorn access log line for these paths (vLLM's flag; comma-separated, e.g. /health,/metrics). As "
        "vLLM, a path matches exactly, without its query string: /health drops /health?x=1, not /health/.",
        "server",
    ),
    Flag(
        "--response-role",
        "str",
        "assistant",
        "The role of chat completions' reply message when the request's add_generation_prompt is true (vLLM's "
        "flag; with add_generation_prompt false the reply continues the last message, in its role).",
        "server",
    ),
    Flag(
        "--return-tokens-as-token-ids",
        "bool",
        False,
        "Name logprobs' tokens `token_id:<id>` (vLLM's flag) in completions and chat completions, for requests "
        "that do not set return_tokens_as_token_ids themselves.",
        "server",
        negatable=True,
    ),
    Flag("--port", "int", 8000, "Port to listen on.", "server", ge=0, le=65535),
    Flag(
        "--api-key",
        "list",
        None,
        "Require one of these keys (Authorization: Bearer <key>) on every path but the public probes; several "
        "keys are each accepted (vLLM's list, e.g. an old and a new key while clients move over); given, it "
        "replaces VLLM_API_KEY (its keys one a line); surrounding whitespace is trimmed; an empty key is refused at "
        "start.",
        "server",
        crd_field="apiKeySecretRef",
        env="VLLM_API_KEY",
    ),
    Flag(
        "--shutdown-timeout",
        "float",
        30,
        "Seconds that in-flight requests get to finish after SIGTERM; then they are aborted "
        "(streams end with an error event and [DONE], others get 503) and the server exits 0.",
        "server",
        ge=0,
        le=3600,
    ),
    Flag(
        "--trust-request-chat-template",
        "bool",
        False,
        "Accept a chat template sent in a request (chat_template, or chat_template_kwargs.chat_template); "
        "refused with 400 unless set, as vLLM.",
        "server",
        negatable=True,
    ),
    Flag(
        "--chat-template",
        "str",
        None,
        "The chat template for every chat rendering in place of the tokenizer's (chat, /tokenize and /v1/embeddings "
        "with messages, the Responses API): a file path, or the template itself, as vLLM: a value that is no "
        "readable file is the template when it holds {, } or a newline, else an error.",
        "server",
    ),
    Flag(
        "--default-chat-template-kwargs",
        "json",
        None,
        "Template variables for every chat rendering, as a JSON object (e.g. {\"enable_thinking\": false}), under "
        "each request's chat_template_kwargs: a request's key wins unless null or \"auto\", as vLLM.",
        "server",
    ),
    Flag(
        "--chat-template-content-format",
        "str",
        "auto",
        "How a message's content reaches the chat template: string (one text), openai (a list of "
        '{"type": "text", "text": ...} parts), or auto: openai when the template loops over a message\'s content, '
        "as vLLM.",
        "server",
        choices=("auto", "string", "openai"),
    ),
    Flag(
        "--enable-request-id-headers",
        "bool",
        False,
        "Add X-Request-Id to every response: the request's own X-Request-Id (which also names the response, "
        "as vLLM), or a random one.",
        "server",
        negatable=True,
    ),
    Flag(
        "--enable-prompt-tokens-details",
        "bool",
        False,
        "Report prompt tokens served from the prefix cache in chat and completions usage "
        "(usage.prompt_tokens_details.cached_tokens), as vLLM; Responses usage always has them.",
        "server",
        negatable=True,
    ),
    Flag(
        "--enable-force-include-usage",
        "bool",
        False,
        "Token usage on every streamed chat and completions response, whatever its stream_options ask (vLLM's flag, "
        "as vLLM now reads it: the final usage chunk and each chunk's usage so far, as include_usage and "
        "continuous_usage_stats); answers that are not streamed, and the Responses API, always carry usage.",
        "server",
        negatable=True,
    ),
    Flag(
        "--enable-auto-tool-choice",
        "bool",
        False,
        'Let the model decide when to call tools (tool_choice "auto", the default when a request has tools); '
        "needs --tool-call-parser.",
        "server",
        negatable=True,
    ),
    Flag(
        "--exclude-tools-when-tool-choice-none",
        "bool",
        False,
        'Leave a request\'s tools out of the prompt when its tool_choice is "none" (by default the chat template '
        "renders them whatever the tool_choice, as vLLM).",
        "server",
        negatable=True,
    ),
    Flag(
        "--tool-call-parser",
        "str",
        None,
        "How tool calls are written in this model family's output (tool_choice auto): hermes (Qwen, Hermes), "
        "llama3_json (Llama 3.x), mistral, qwen3_coder (Qwen3-Coder, Qwen3.5: XML calls).",
        "server",
        choices=("hermes", "llama3_json", "mistral", "qwen3_coder"),
    ),
    Flag(
        "--reasoning-parser",
        "str",
        None,
        "Return a thinking model's <think>...</think> as reasoning_content apart from content (streamed too): "
        "deepseek_r1 (thinking opened by the template), qwen3 (opened by the model).",
        "server",
        choices=("deepseek_r1", "qwen3"),
    ),
    Flag(
        "--max-request-body-size",
        "int",
        8 * 1024 * 1024,
        "Largest request body in bytes; larger bodies get 413 before they are read.",
        "server",
        ge=1,
    ),
    Flag(
        "--max-body-bytes-in-flight",
        "int",
        None,
        "Most request-body bytes being received and parsed at once, server-wide (default: 16 x "
        "--max-request-body-size); a request whose body would go past it gets 503 with Retry-After at once.",
        "server",
        ge=1,
    ),
    Flag(
        "--limit-concurrency",
        "int",
        1024,
        "Most connections and requests in progress at once; beyond it new requests get 503 (uvicorn's "
        "limit_concurrency).",
        "server",
        ge=1,
    ),
    Flag(
        "--timeout-keep-alive",
        "float",
        5.0,
        "Seconds an idle keep-alive connection stays open (uvicorn's timeout_keep_alive).",
        "server",
        env="VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
        gt=0,
    ),
    Flag(
        "--header-read-timeout",
        "float",
        10.0,
        "Seconds a client has to send a request's line and headers, from connecting or from the previous "
        "response; slower connections are closed.",
        "server",
        gt=0,
    ),
    Flag(
        "--body-read-timeout",
        "float",
        30.0,
        "Seconds a client has to send a whole request body; slower ones get 408 and are closed.",
        "server",
        gt=0,
    ),
    Flag(
        "--h11-max-incomplete-event-size",
        "int",
        16 * 1024,
        "Most bytes buffered of an unfinished request head (h11's max_incomplete_event_size); more get 400.",
        "server",
        ge=1,
    ),
    Flag(
        "--h11-max-header-count",
        "int",
        256,
        "Most headers in one request; more get 431.",
        "server",
        ge=1,
    ),
    Flag(
        "--enable-server-load-tracking",
        "bool",
        False,
        "Count the generation and embedding requests in progress for GET /load ({\"server_load\": N}; 0 without "
        "this flag), as vLLM.",
        "server",
        negatable=True,
    ),
    Flag(
        "--root-path",
        "str",
        None,
        "The path prefix a proxy serves the API under (FastAPI's root_path, as vLLM): routes, the API key's public "
        "paths and the drain answer under it.",
        "server",
    ),
    Flag(
        "--ssl-certfile",
        "str",
        None,
        "Serve HTTPS with this PEM certificate (chain) file, as vLLM's; with --ssl-keyfile when the key is a file of "
        "its own. Checked at start-up: a file that cannot be loaded is a usage error.",
        "server",
    ),
    Flag(
        "--ssl-keyfile",
        "str",
        None,
        "The PEM private key of --ssl-certfile (needs it).",
        "server",
    ),
    Flag(
        "--ssl-ca-certs",
        "str",
        None,
        "With --ssl-certfile: the PEM file of CA certificates that clients' certificates are checked against (vLLM's "
        "flag, uvicorn's ssl_ca_certs), for --ssl-cert-reqs 1 or 2. Checked at start-up: a file that cannot be "
        "loaded is a usage error.",
        "server",
    ),
    Flag(
        "--ssl-cert-reqs",
        "int",
        0,
        "With --ssl-certfile: whether clients must show a certificate (vLLM's flag, Python's ssl.VerifyMode): 0 none "
        "is asked for; 1 optional (one shown must verify against --ssl-ca-certs); 2 required (mutual TLS: a client "
        "without a certificate those CAs signed is refused in the TLS handshake). 1 and 2 need --ssl-ca-certs.",
        "server",
        choices=(0, 1, 2),
    ),
    Flag(
        "--allowed-origins",
        "json",
        ["*"],
        "CORS: origins a browser may call the server from, as a JSON list (vLLM's flag and default: any).",
        "server",
    ),
    Flag(
        "--allowed-methods",
        "json",
        ["*"],
        "CORS: methods allowed from those origins, as a JSON list (default: any).",
        "server",
    ),
    Flag(
        "--allowed-headers",
        "json",
        ["*"],
        "CORS: request headers allowed from those origins, as a JSON list (default: any).",
        "server",
    ),
    Flag(
        "--allow-credentials",
        "bool",
        False,
        "CORS: allow credentials (cookies, HTTP auth) on cross-origin requests.",
        "server",
        negatable=True,
    ),
    Flag(
        "--disable-fastapi-docs",
        "bool",
        False,
        "Serve no API schema (/openapi.json is a 404), as vLLM's flag; the Swagger UI and ReDoc pages vLLM also "
        "turns off are never served here.",
        "server",
        negatable=True,
    ),
    Flag(
        "--uvicorn-log-level",
        "str",
        "info",
        "uvicorn's log level.",
        "server",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
    ),
)

# vLLM's option spelling of MODEL (`vllm serve --model X`): `flotilla serve` takes it beside the positional (both
# given must agree); not a flag of the table above, since MODEL is no engine component's setting but what is loaded.
MODEL_FLAG = "--model"
# vLLM's YAML file of flags (`vllm serve --config FILE`, engine/server/config_file.py): not a setting either, but
# where more of the command line is written.
CONFIG_FLAG = "--config"

_BY_NAME = {f.name: f for f in FLAGS}
_BY_CRD_FIELD = {f.crd_field: f for f in FLAGS if f.crd_field}


def flag(name: str) -> Flag:
    """Look a flag up by its CLI name (`--max-model-len`)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown engine flag {name}") from None


def flag_for_crd_field(path: str) -> Flag | None:
    """The flag an InferenceService spec field (dotted path under `spec`) sets, if any."""
    return _BY_CRD_FIELD.get(path)


def markdown_table() -> str:
    """The flag reference as a Markdown table (the README embeds it; a test keeps them equal)."""
    rows = ["| flag | type | default | InferenceService field | status |", "|---|---|---|---|---|",
            f"| MODEL, `{MODEL_FLAG}` | str | the embedded model | `spec.model.source` | yes |",
            f"| `{CONFIG_FLAG}` FILE | YAML file of these flags | none |  | yes |"]
    for f in FLAGS:
        names = ", ".join(f"`{n}`" for n in (*f.aliases, f.name)) + (f" / `--no-{f.name[2:]}`" if f.negatable else "")
        status = "yes" if f.implemented else "refused" if f.refusal else "not yet"  # refused: vLLM's, not honoured here
        if f.implemented and f.supported_values is not None:
            status = "only " + ", ".join(str(v) for v in f.supported_values)
        env = f" (env `{f.env}`)" if f.env else ""
        field = f"`spec.{f.crd_field}`" if f.crd_field else ""
        rows.append(f"| {names}{env} | {f.type} | `{f.default}` | {field} | {status} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
