"""Tool-call parsers: turn a model's text in its family's tool-call format into OpenAI tool calls."""
