"""Speculative decoding: proposers guess the next tokens, one target pass verifies them all.

- `config`: `--speculative-config` (vLLM's JSON keys) as a validated component.
- `policy`: which requests and which steps speculate (the `disable_by_batch_size` load rule).
- `ngram_proposer` / `draft_model_proposer`: where the guesses come from.
- `drafts`: puts the guesses into a planned step (the scheduler reserved their KV slots).
- `rejection_sampler`: the exact acceptance rule over the target's logits.
"""
