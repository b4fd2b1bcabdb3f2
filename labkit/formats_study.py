"""Quantization-error study behind notebooks/00_formats: the E2M1 grid, byte layouts, and error per format."""

from __future__ import annotations

import math

import pandas as pd
import torch

from kernels import (
    E2M1_VALUES,
    ROUNDINGS,
    dequantize_mxfp4,
    dequantize_mxfp8,
    dequantize_nvfp4,
    quantize_mxfp4,
    quantize_mxfp8,
    quantize_nvfp4,
)
from kernels.formats import mxfp4_codes

DISTRIBUTIONS = ("normal", "heavy-tailed", "outliers")


def sample(distribution: str, rows: int, cols: int = 2880, seed: int = 0) -> torch.Tensor:
    """Seeded weights-like data: normal, heavy-tailed (Student-t, 3 dof) or normal with 0.1% outliers at 50x."""
    g = torch.Generator().manual_seed(seed)
    if distribution == "normal":
        return torch.randn(rows, cols, generator=g)
    if distribution == "heavy-tailed":
        z = torch.randn(rows, cols, generator=g)
        chi2 = torch.randn(rows, cols, 3, generator=g).pow(2).sum(-1)
        return z / torch.sqrt(chi2 / 3)
    if distribution == "outliers":
        x = torch.randn(rows, cols, generator=g)
        mask = torch.rand(rows, cols, generator=g) < 1e-3
        return torch.where(mask, x * 50, x)
    raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")


def e2m1_grid() -> pd.DataFrame:
    """Every E2M1 code with its bits and value."""
    return pd.DataFrame({
        "code": range(16),
        "bits": [f"{c:04b}" for c in range(16)],
        "sign": [c >> 3 for c in range(16)],
        "exponent": [(c >> 1) & 3 for c in range(16)],
        "mantissa": [c & 1 for c in range(16)],
        "value": [("-" if c >= 8 else "") + f"{abs(E2M1_VALUES[c]):g}" for c in range(16)],
    })


def layout_example(x: torch.Tensor) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One 32-value block: per element its value, code and scaled value; per byte the openai and ggml bytes."""
    block = x.reshape(-1)[:32].reshape(1, 32).to(torch.float32)
    qo = quantize_mxfp4(block, layout="openai")
    qg = quantize_mxfp4(block, layout="ggml")
    codes = mxfp4_codes(qo).reshape(-1)
    scale = float(2.0 ** (int(qo.scales.reshape(-1)[0]) - 127))
    elems = pd.DataFrame({
        "element": range(32),
        "x": block.reshape(-1).tolist(),
        "code": codes.tolist(),
        "e2m1": [E2M1_VALUES[c] for c in codes.tolist()],
        "decoded": dequantize_mxfp4(qo).reshape(-1).tolist(),
    })
    elems.attrs["scale_byte"] = int(qo.scales.reshape(-1)[0])
    elems.attrs["scale"] = scale
    ob, gb = qo.blocks.reshape(-1).tolist(), qg.blocks.reshape(-1).tolist()
    bytes_ = pd.DataFrame({
        "byte": range(16),
        "openai_hex": [f"{b:02x}" for b in ob],
        "openai_elements": [f"{2 * j} (lo), {2 * j + 1} (hi)" for j in range(16)],
        "ggml_hex": [f"{b:02x}" for b in gb],
        "ggml_elements": [f"{j} (lo), {j + 16} (hi)" for j in range(16)],
    })
    return elems, bytes_


def _errors(name: str, x: torch.Tensor, y: torch.Tensor, bits_per_value: float) -> dict:
    err = (y - x).to(torch.float64)
    x64 = x.to(torch.float64)
    mse = float(err.pow(2).mean())
    return {
        "format": name,
        "bits_per_value": bits_per_value,
        "rel_rmse": math.sqrt(mse / float(x64.pow(2).mean())),
        "max_abs_err": float(err.abs().max()),
        "sqnr_db": 10 * math.log10(float(x64.pow(2).mean()) / mse) if mse > 0 else math.inf,
        "zeroed_frac": float(((y == 0) & (x != 0)).to(torch.float64).mean()),
    }


def quantization_errors(x: torch.Tensor) -> pd.DataFrame:
    """Error of MXFP4 under each rounding mode, NVFP4 and MXFP8 on the same data (one row per format)."""
    rows = [_errors(f"mxfp4/{r}", x, dequantize_mxfp4(quantize_mxfp4(x, rounding=r)), 4 + 8 / 32) for r in ROUNDINGS]
    rows.append(_errors("nvfp4", x, dequantize_nvfp4(quantize_nvfp4(x)), 4 + 8 / 16))
    rows.append(_errors("mxfp8", x, dequantize_mxfp8(quantize_mxfp8(x)), 8 + 8 / 32))
    return pd.DataFrame(rows)


def error_histograms(x: torch.Tensor, formats: tuple[str, ...] = ("mxfp4/floor", "mxfp4/rceil", "mxfp4/even", "nvfp4"),
                     bins: int = 60) -> pd.DataFrame:
    """Histogram of per-element |error| (log-spaced bins, exact zeros counted in the first bin) per format.

    Binned here rather than in the browser so charts stay small whatever the data size.
    """
    import numpy as np

    errs = {}
    for f in formats:
        if f == "nvfp4":
            y = dequantize_nvfp4(quantize_nvfp4(x))
        else:
            y = dequantize_mxfp4(quantize_mxfp4(x, rounding=f.split("/")[1]))
        errs[f] = (y - x).abs().reshape(-1).to(torch.float64).numpy()
    nz = np.concatenate([e[e > 0] for e in errs.values()])
    lo, hi = (float(nz.min()), float(nz.max())) if nz.size else (1e-8, 1.0)
    edges = np.logspace(np.log10(lo), np.log10(hi) + 1e-9, bins + 1)
    parts = []
    for f, e in errs.items():
        counts, _ = np.histogram(np.clip(e, lo, hi), bins=edges)
        parts.append(pd.DataFrame({"format": f, "abs_err": np.sqrt(edges[:-1] * edges[1:]), "count": counts}))
    return pd.concat(parts, ignore_index=True)


def error_chart(errors: pd.DataFrame, title: str):
    """Bar chart of relative RMSE per format (lower is better), annotated with SQNR."""
    import plotly.express as px

    fig = px.bar(errors, x="format", y="rel_rmse", text=errors["sqnr_db"].map(lambda v: f"{v:.1f} dB"),
                 title=title, labels={"rel_rmse": "relative RMS error"})
    fig.update_traces(textposition="outside")
    return fig


def error_histogram(hist: pd.DataFrame, title: str):
    """Per-element absolute error distribution per format (lines over log-spaced bins)."""
    import plotly.express as px

    fig = px.line(hist, x="abs_err", y="count", color="format", log_x=True, log_y=True, title=title,
                  labels={"abs_err": "|dequantized - x| (zeros in the first bin)", "count": "elements"})
    return fig
