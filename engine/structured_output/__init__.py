"""Structured output: grammars (JSON schema, regex, choice, EBNF) that constrain which tokens a request
may draw, compiled and matched by xgrammar."""
