"""The KV and indexer-key rows the synthetic forward pass writes, and how to read them back.

Every row is a pure function of (request, layer, position): a hash picks one row of a fixed
table of well-formed rows. Both arms, the prefill and every decode step write the same bytes for
the same token, whatever order the coordinator schedules them in, so an attention output can be
recomputed from the top-k alone (the reference the checks compare with).

DeepSeek V3.2's rows (``fp8_ds_mla``, 656 B): 512 float8 e4m3 NoPE values, 4 float32 scales (one
per 128 values), 64 bfloat16 RoPE values. Indexer keys (132 B): 128 float8 e4m3 values and one
float32 scale. The hash uses only ``*``, ``^``, ``>>`` and ``&`` on int64 values that never
overflow, so numpy arrays and PyTorch tensors give the same numbers.
"""

import numpy as np

KV_ROW_BYTES = 656
NOPE = 512
ROPE = 64
QK_DIM = NOPE + ROPE  # 576: the query/key width FlashMLA reads
INDEXER_ROW_BYTES = 132
INDEXER_DIM = 128

KV_SALT = 0
INDEXER_SALT = 1


def whole_view(view: dict, pool_bytes: int) -> dict:
    """``view`` with every page of the pool counted: a layer view whose page stride is the block
    (indexer and regular groups) at a nonzero offset reports one page fewer than the pool holds,
    so the last block's rows would be out of its range."""
    page = view["rows_per_page"] * view["row_bytes"]
    pages = (pool_bytes - view["offset"] - page) // view["page_stride"] + 1
    return dict(view, num_pages=max(pages, view["num_pages"]))


def row_hash(req, layer, pos, salt):
    """A 32-bit hash of (request, layer, position, salt); arrays (numpy or PyTorch, int64) or
    ints. Requests below 2^20, layers below 2^10, positions below 2^24."""
    x = (req * 0x01000193) ^ (layer * 0x00BC614F + salt * 0x3C6EF35F) ^ (pos * 0x27D4EB2F)
    x = x & 0x7FFFFFFF
    x = (x * 0x5BD1E995) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    return x ^ (x >> 13)


def _fp8_e4m3_table() -> np.ndarray:
    """float32 value of every float8 e4m3fn byte (NaN for 0x7f and 0xff)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0**-6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    val = sign * val
    val[(exp == 15) & (man == 7)] = np.nan
    return val.astype(np.float32)


FP8_E4M3 = _fp8_e4m3_table()


def _fp8_bytes(rng: np.random.Generator, shape) -> np.ndarray:
    """Random float8 e4m3 bytes, never NaN."""
    b = rng.integers(0, 256, size=shape, dtype=np.uint8)
    return np.where((b & 0x7F) == 0x7F, b ^ 0x01, b).astype(np.uint8)


def kv_table(n: int, seed: int) -> np.ndarray:
    """``n`` well-formed 656-byte fp8_ds_mla rows, uint8 ``[n, 656]``."""
    rng = np.random.default_rng(seed)
    nope = _fp8_bytes(rng, (n, NOPE))
    scales = rng.uniform(0.25, 1.0, size=(n, 4)).astype(np.float32) / 64.0
    rope = (rng.standard_normal((n, ROPE)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.concatenate([nope, scales.view(np.uint8), rope.view(np.uint8)], axis=1)


def indexer_table(n: int, seed: int) -> np.ndarray:
    """``n`` indexer keys of 132 bytes, uint8 ``[n, 132]``."""
    rng = np.random.default_rng(seed + 1)
    vals = _fp8_bytes(rng, (n, INDEXER_DIM))
    scale = rng.uniform(0.5, 1.0, size=(n, 1)).astype(np.float32)
    return np.concatenate([vals, scale.view(np.uint8)], axis=1)


def decode_kv(rows: np.ndarray):
    """656-byte rows ``[..., 656]`` → (key ``[..., 576]``, value ``[..., 512]``) in float32: the
    NoPE values times their scales, then the RoPE values."""
    rows = np.ascontiguousarray(rows)
    nope = FP8_E4M3[rows[..., :NOPE]].reshape(*rows.shape[:-1], 4, 128)
    scales = rows[..., NOPE : NOPE + 16].copy().view(np.float32)[..., None]
    value = (nope * scales).reshape(*rows.shape[:-1], NOPE)
    rope_bits = rows[..., NOPE + 16 :].copy().view(np.uint16).astype(np.uint32) << 16
    rope = rope_bits.view(np.float32)
    return np.concatenate([value, rope], axis=-1), value


def decode_keys(rows: np.ndarray):
    """132-byte indexer keys ``[..., 132]`` → (values ``[..., 128]`` float32, scale ``[...]``)."""
    rows = np.ascontiguousarray(rows)
    vals = FP8_E4M3[rows[..., :INDEXER_DIM]]
    scale = rows[..., INDEXER_DIM:].copy().view(np.float32)[..., 0]
    return vals, scale


def reference_attention(q: np.ndarray, rows: np.ndarray, valid: np.ndarray, sm_scale: float):
    """Sparse MLA decode in plain numpy (float64 accumulation): ``q`` float32 ``[B, H, 576]``,
    ``rows`` uint8 ``[B, K, 656]`` (the rows the top-k selected, in top-k order), ``valid`` bool
    ``[B, K]``. Returns (output float32 ``[B, H, 512]``, log-sum-exp float32 ``[B, H]``, natural
    log; ``-inf`` and a zero output where no entry is valid). Deterministic: equal inputs give
    equal bits, which is what the dry run's comparisons rely on."""
    key, value = decode_kv(rows)
    scores = np.einsum("bhd,bkd->bhk", q.astype(np.float64), key.astype(np.float64)) * sm_scale
    scores = np.where(valid[:, None, :], scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.exp(scores - safe)
    total = weights.sum(axis=-1, keepdims=True)
    out = np.einsum("bhk,bkd->bhd", weights, value.astype(np.float64)) / np.where(total > 0, total, 1.0)
    lse = np.where(total[..., 0] > 0, np.log(np.where(total[..., 0] > 0, total[..., 0], 1.0)) + safe[..., 0], -np.inf)
    return out.astype(np.float32), lse.astype(np.float32)
