"""The pooling runner: embeddings from a decoder's last-token hidden state (vLLM's `--runner pooling`)."""
