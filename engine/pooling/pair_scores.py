"""The offline `LLM.score`: each pair's score on the engine's thread, by the model's kind (scoring.py's rules). A
classifier of one label (a cross-encoder) classifies each pair's encoding; an embedding model (a bi-encoder) embeds
each distinct text once (1 to N embeds the one first text once) and scores the cosine of each pair's embeddings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flotilla.engine.errors import InvalidParamError
from flotilla.engine.pooling import scoring
from flotilla.engine.pooling.classifier_config import labels
from flotilla.engine.pooling.classify import classify_prompts
from flotilla.engine.pooling.embed import embed_prompts
from flotilla.engine.pooling.output import ScoringOutput, ScoringRequestOutput
from flotilla.engine.pooling.params import PoolingParams
from flotilla.engine.prompt_truncation import truncate_prompt

if TYPE_CHECKING:
    from flotilla.engine.llm_engine import LLMEngine

# A side's item: a text, or a token-id prompt.
ScoreItem = str | list[int]


def score_pairs(engine: LLMEngine, first: list[ScoreItem], second: list[ScoreItem], use_activation: bool,
                truncate_prompt_tokens: int | None) -> list[ScoringRequestOutput]:
    """One ScoringRequestOutput per pair, in pair order (InvalidParamError for a bad pairing or input)."""
    model = engine.config.model
    if model.runner != "pooling":
        raise InvalidParamError("scoring needs the pooling runner: start the engine with runner='pooling' (an "
                                "embedding model scores the cosine of two texts, a one-label classifier each pair)",
                                param="model")
    scoring.check_pairing(("data_1", len(first)), ("data_2", len(second)))
    if model.convert == "classify":
        return _cross_encoder_scores(engine, first, second, use_activation, truncate_prompt_tokens)
    return _bi_encoder_scores(engine, first, second, truncate_prompt_tokens)


def _cross_encoder_scores(engine: LLMEngine, first: list[ScoreItem], second: list[ScoreItem], use_activation: bool,
                          truncate_prompt_tokens: int | None) -> list[ScoringRequestOutput]:
    count = len(labels(engine.config.model.hf_config))
    if count != 1:
        raise InvalidParamError(f"this classifier has {count} labels: a cross-encoder score needs one (use "
                                "classify() for its class probabilities)", param="model")
    tokenizer, max_len = engine.tokenizer, engine.config.model.max_model_len
    # The tokenizer pairs texts, not ids: a token-id item is decoded first, as vLLM does.
    texts = [[item if isinstance(item, str) else tokenizer.decode(item) for item in side] for side in (first, second)]
    prompts = [scoring.pair_encoding(tokenizer, a, b, truncate_prompt_tokens, max_len)
               for a, b in scoring.pairs(*texts)]
    outputs = classify_prompts(engine, prompts, use_activation)
    return [ScoringRequestOutput(str(i), ScoringOutput(o.probs[0]), ids)
            for i, (o, ids) in enumerate(zip(outputs, prompts, strict=True))]


def _bi_encoder_scores(engine: LLMEngine, first: list[ScoreItem], second: list[ScoreItem],
                       truncate_prompt_tokens: int | None) -> list[ScoringRequestOutput]:
    max_len = engine.config.model.max_model_len
    prompts = [truncate_prompt(engine.tokenizer.encode(item) if isinstance(item, str) else list(item),
                               truncate_prompt_tokens, max_len) for item in first + second]
    vectors = [o.embedding for o in embed_prompts(engine, prompts, PoolingParams())]
    split = len(first)
    indices = scoring.pairs(list(range(split)), list(range(split, len(prompts))))
    scores = scoring.cosine_scores(vectors[:split], vectors[split:])
    pad = engine.tokenizer.pad_token_id
    return [ScoringRequestOutput(f"{i}_{j}", ScoringOutput(score), scoring.pair_token_ids(prompts[i], prompts[j], pad))
            for (i, j), score in zip(indices, scores, strict=True)]
