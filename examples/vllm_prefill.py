"""vLLM's indexer prefill through indexer, on CPU: a step laid out as vLLM lays it out.

    python examples/vllm_prefill.py

Builds a step as vLLM's indexer metadata builder chunks it (decode rows first, two requests
packed in one gathering of the key workspace, a long request cut into sub-chunks that reuse
its gathering), then fills vLLM's ``topk_indices_buffer`` two ways: the one-shot
``prefill_topk`` and a plan made once for the step and run per layer. Both must equal what
vLLM's own loop computes chunk by chunk (here: ``indexer.prefill_topk`` on each chunk).
"""

from __future__ import annotations

import torch

import indexer
from indexer.integrations import vllm as indexer_vllm
from indexer.synthetic import vllm_prefill_step

TOPK = 128


def main() -> None:
    step = vllm_prefill_step([3000, 1500, 6000], [500, 1500, 4000], decode_rows=8, heads=8, head_dim=64,
                             chunk_keys=6000, subchunk_rows=1024)
    print(f"{step.q.shape[0]} rows ({len(step.chunks)} prefill chunks after 8 decode rows), "
          f"workspace of {step.workspace_keys} keys")
    k_quant_full, k_scale_full = step.workspace()  # vLLM's shared workspace: stale bytes past each gathering
    heads, dim = step.q.shape[1:]

    # the one-shot call, in place of vLLM's prefill chunk loop
    buffer = torch.full((step.q.shape[0], TOPK), -1, dtype=torch.int32)
    indexer_vllm.prefill_topk(step, step.q, k_quant_full, k_scale_full, step.weights, buffer, TOPK,
                              gather=step.gather, max_logits_mb=512)

    # or: plan once per step, run in every layer
    plan = indexer_vllm.plan_prefill(step, heads=heads, head_dim=dim, topk=TOPK, max_logits_mb=512)
    print(plan)
    planned = torch.full_like(buffer, -1)
    plan.run(step.q, k_quant_full, k_scale_full, step.weights, planned, gather=step.gather)

    # what vLLM's loop computes, chunk by chunk
    for chunk in step.chunks:
        step.gather(chunk, k_quant_full, k_scale_full)
        n, rows = chunk.max_local_total_seq_lens, slice(chunk.token_start, chunk.token_end)
        want = indexer.prefill_topk(step.q[rows], k_quant_full[:n], indexer_vllm.key_scales(k_scale_full[:n]),
                                    step.weights[rows], chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, TOPK)
        for name, got in (("prefill_topk", buffer), ("plan_prefill", planned)):
            if not torch.equal(got[rows].sort(1).values, want.sort(1).values):
                raise SystemExit(f"{name}: rows [{chunk.token_start}, {chunk.token_end}) differ")
    print("the same sets as chunk by chunk: yes")


if __name__ == "__main__":
    main()
