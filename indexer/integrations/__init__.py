"""Adapters from inference engines' indexer call sites to :func:`indexer.plan`.

Each module takes an engine's tensors and metadata as they come (duck-typed: the engine is
never imported here) and replaces the logits + top-k part of its indexer prefill with one
call. ``docs/integrations.md`` shows the patch for each engine.

* :mod:`indexer.integrations.vllm`: vLLM's ``sparse_attn_indexer`` prefill chunk loop.
"""
