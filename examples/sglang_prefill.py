"""SGLang's DSA indexer prefill through indexer, on CPU: an extend batch laid out as SGLang's
backend lays it out.

    python examples/sglang_prefill.py

Builds an extend batch (a request with a cached prefix, a whole prefill, a short one), then
fills SGLang's ``topk_result`` the two ways its ``topk_transform`` writes it: ``ragged`` (the
key's column in the gathered key buffer) and ``paged`` (the key's KV-cache slot), one-shot and
from a plan made once for the step and run per layer. Each must equal the row-relative top-k
(``indexer.prefill_topk``) put through SGLang's transform by hand.
"""

from __future__ import annotations

import torch

import indexer
from indexer.integrations import sglang as indexer_sglang
from indexer.synthetic import sglang_extend_batch

TOPK = 128


def main() -> None:
    b = sglang_extend_batch([3000, 1500, 100], [1000, 1500, 100], heads=8, head_dim=64)
    rows, keys = b.ks.numel(), b.k_fp8.shape[0]
    heads, dim = b.q_fp8.shape[1:]
    print(f"{rows} extend rows of 3 requests, {keys} gathered keys")
    table = dict(topk_indices_offset=b.topk_indices_offset, page_table_1=b.page_table_1,
                 token_to_batch_idx=b.token_to_batch_idx)

    # in place of the logits + topk_transform of SGLang's _get_topk_ragged
    ragged = indexer_sglang.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale, b.weights, b.ks, b.ke, TOPK,
                                         transform="ragged", **table)
    # or: plan once per forward step (where ks/ke are built), run in every layer
    plan = indexer_sglang.plan_prefill(b.ks, b.ke, num_keys=keys, heads=heads, head_dim=dim, topk=TOPK,
                                       transform="paged", **table)
    print(plan)
    paged = torch.full((rows, TOPK), -1, dtype=torch.int32)
    plan.run(b.q_fp8, b.k_fp8, b.k_scale, b.weights, paged)

    # the row-relative top-k, and SGLang's two transforms of it by hand
    rel = indexer.prefill_topk(b.q_fp8, b.k_fp8, b.k_scale.view(torch.float32).reshape(-1), b.weights.squeeze(-1),
                               b.ks, b.ke, TOPK)
    ok = True
    for i in range(rows):
        sel = [j for j in rel[i].tolist() if j >= 0]
        want_ragged = {j + int(b.topk_indices_offset[i]) for j in sel}
        want_paged = {int(b.page_table_1[int(b.token_to_batch_idx[i]), j]) for j in sel}
        ok &= {x for x in ragged[i].tolist() if x >= 0} == want_ragged
        ok &= {x for x in paged[i].tolist() if x >= 0} == want_paged
    if not ok:
        raise SystemExit("a row differs")
    print("the same sets as SGLang's transform of the reference: yes")


if __name__ == "__main__":
    main()
