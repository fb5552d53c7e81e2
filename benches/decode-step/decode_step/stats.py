"""Small measurements shared by the kernels and the driver."""

import numpy as np


def overlap_of(prev: np.ndarray, cur: np.ndarray) -> float:
    """Mean share of each row's valid top-k entries that the previous step selected too
    (``prev`` and ``cur``: int ``[..., top_k]``, -1 = none)."""
    shares = []
    for p, c in zip(prev.reshape(-1, prev.shape[-1]), cur.reshape(-1, cur.shape[-1])):
        c = c[c >= 0]
        if c.size:
            shares.append(np.intersect1d(p[p >= 0], c).size / c.size)
    return float(np.mean(shares)) if shares else float("nan")
