"""The lightning indexer's logits in one Triton kernel: each request's fp8 keys read once, straight
from the paged indexer pool through the runtime's indexer table.

Per request ``b`` and position ``p`` (one program per request and page):

    logits[b, p] = scale[p] * sum_h w[b, h] * relu(q[b, h, :] . k[p, :])      (p <= pos[b])
    logits[b, p] = -inf                                                        (p > pos[b])

with ``k[p]`` the key's 128 fp8 e4m3 values as bfloat16, ``scale[p]`` its fp32 scale (the last 4
bytes of its 132-byte row), the products accumulated in fp32 on the tensor cores. The PyTorch
ops of ``kernels_torch`` compute the same with bfloat16 intermediates (so the two agree to
bfloat16 rounding, not bit for bit); they gather every key into a new tensor and widen it
before the ``bmm``, which moves several times the keys' bytes.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _indexer_logits(pages, page_stride, row_stride, table, table_stride, state, pos, q, w, out,
                    out_stride, H: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr):
    b = tl.program_id(0)
    p = tl.program_id(1)
    length = tl.load(pos + b)
    rows = tl.arange(0, ROWS)
    token = p * ROWS + rows
    live = p * ROWS <= length
    entry = tl.load(table + tl.load(state + b) * table_stride + p)
    page = tl.where(live & (entry >= 0), entry, 0).to(tl.int64)
    base = pages + page * page_stride + rows.to(tl.int64) * row_stride
    dims = tl.arange(0, D)
    keys = tl.load(base[:, None] + dims[None, :])
    keys = keys.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    scale = tl.load((base + D).to(tl.pointer_type(tl.float32)))
    heads = tl.arange(0, H)
    query = tl.load(q + b * H * D + heads[:, None] * D + dims[None, :])
    s = tl.dot(keys, tl.trans(query))
    s = tl.maximum(s, 0.0)
    weight = tl.load(w + b * H + heads).to(tl.float32)
    logit = tl.sum(s * weight[None, :], axis=1) * scale
    logit = tl.where(token <= length, logit, float("-inf"))
    tl.store(out + b * out_stride + token, logit)


def logits(pages: torch.Tensor, table: torch.Tensor, state: torch.Tensor, pos: torch.Tensor,
           q: torch.Tensor, w: torch.Tensor, out: torch.Tensor, dim: int) -> None:
    """Writes ``out[b, :]`` for every request ``b`` of the batch.

    ``pages``: the layer's indexer pool view ``[pages, rows, row_bytes]`` (uint8); ``table``:
    ``[state rows, max pages]`` int32; ``state``, ``pos``: ``[B]`` int64; ``q``: ``[B, H, dim]``
    bfloat16; ``w``: ``[B, H]`` bfloat16 (any view with unit stride over heads); ``out``:
    ``[B, max pages * rows]`` float32.
    """
    B, H, D = q.shape
    assert D == dim and q.is_contiguous() and out.stride(1) == 1
    rows = pages.shape[1]
    grid = (B, out.shape[1] // rows)
    _indexer_logits[grid](pages, pages.stride(0), pages.stride(1), table, table.stride(0), state,
                          pos, q, w, out, out.stride(0), H=H, D=D, ROWS=rows)
