"""Divergence finder: run two model variants on the same tokens and name the first component that departs.

Each variant's per-component outputs are captured through the model's hooks (embedding; per layer the
attention output, the router's dense gate matrix, the MoE's mlp1 (SwiGLU output) and mlp2 per assignment
where the backend exposes them, the MoE output and the residual stream; then the final norm and the logits)
and compared in execution order by relative error ||B - A|| / ||A||. The first (layer, component) over the
tolerance is where to look for the bug: everything before it agrees. The router, MoE and residual rows also
carry their error over the tokens both runs routed alike (`rel_err_agreed`, `flipped`): a few near-tie tokens
flip under any change of arithmetic, a faulty router flips many.

Variants are written as specs: "ref" (torch attention and MoE, bf16 lm_head), "kernels" (attention_sinks,
moe_mxfp4, mxfp4_linear),
a fault name (ref with that fault), or comma-separated items mixing those with key=value settings:
attention=torch|triton, moe=torch|torch-w4a8|triton, lm_head=bf16|mxfp4-torch|mxfp4,
rounding=floor|ceil|rceil|even, layout=rows|tiled|rows+nib|tiled+nib (weight layout of the MXFP4 kernels),
lm_head_layout= (the mxfp4 lm_head's own; layout's by default), e.g. "kernels,sinks_dropped",
"kernels,layout=tiled" or "moe=torch,lm_head=mxfp4-torch,rounding=even".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch

from .backends import Backends
from .config import ModelConfig, get_config
from .faults import FAULTS, TORCH_MOE_FAULTS
from .model import GptOss
from .weights import Weights, synthetic_weights

#: Execution order of the captured components within a forward pass.
CAPTURED = ("embedding", "attention", "router", "moe.mlp1", "moe.mlp2", "moe", "residual", "final_norm", "logits")
BASES = {"ref": {"attention": "torch", "moe": "torch", "lm_head": "bf16"},
         "kernels": {"attention": "triton", "moe": "triton", "lm_head": "mxfp4"}}
DEFAULT_TOL = 0.05


@dataclass(frozen=True)
class Variant:
    label: str
    backends: Backends
    faults: frozenset = field(default_factory=frozenset)


def parse_variant(spec: str | Variant) -> Variant:
    """A Variant from a spec string (see the module docstring)."""
    if isinstance(spec, Variant):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"variant spec must be a non-empty string, got {spec!r}")
    settings, faults = dict(BASES["ref"]), set()
    keys = {"moe": "moe", "lm_head": "lm_head", "lm-head": "lm_head", "rounding": "lm_head_rounding",
            "attention": "attention", "layout": "layout", "lm_head_layout": "lm_head_layout"}
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if "=" in item:
            key, value = (s.strip() for s in item.split("=", 1))
            if key == "faults":
                faults.update(v for v in value.split("+") if v)
            elif key in keys:
                settings[keys[key]] = value
            else:
                raise ValueError(f"variant {spec!r}: unknown setting {key!r}; "
                                 f"use attention=, moe=, lm_head=, rounding=, layout=, lm_head_layout=, faults=")
        elif item in BASES:
            settings.update(BASES[item])
        elif item in FAULTS:
            faults.add(item)
        else:
            raise ValueError(f"variant {spec!r}: {item!r} is neither ref, kernels, a key=value setting nor a fault "
                             f"({', '.join(FAULTS)})")
    return Variant(spec, Backends(**settings), frozenset(faults))


@dataclass
class Capture:
    """Component outputs of one forward pass, keyed (layer or None, component), in execution order."""

    outputs: dict

    def keys(self) -> list:
        return list(self.outputs)


def capture(model: GptOss, tokens: torch.Tensor) -> Capture:
    """Run tokens [B, T] from an empty cache and keep every component's output (fp32 copies)."""
    out = {}

    def hook(layer, name, t):
        out[(layer, name)] = t.detach().to(torch.float32).clone()

    tokens = tokens.to(model.device)
    with model.add_hook(hook), torch.inference_mode():
        model.forward(tokens, model.new_cache(tokens.shape[0], tokens.shape[1]), all_logits=True)
    return Capture(out)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """||b - a|| / ||a|| in float64 (inf for mismatched shapes, 0 when both are zero)."""
    if a.shape != b.shape:
        return math.inf
    a64, b64 = a.to(torch.float64), b.to(a.device, torch.float64)
    den = a64.norm().item()
    num = (b64 - a64).norm().item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def compare(a: Capture, b: Capture) -> pd.DataFrame:
    """One row per component output both captures have, in A's execution order."""
    rows = []
    for step, key in enumerate(a.keys()):
        if key not in b.outputs:
            continue
        ta, tb = a.outputs[key], b.outputs[key].to(a.outputs[key].device)  # the two runs may sit on two devices
        layer, comp = key
        same_shape = ta.shape == tb.shape
        rows.append({
            "step": step, "layer": layer, "component": comp,
            "rel_err": relative_error(ta, tb),
            "max_abs_err": (tb - ta).abs().max().item() if same_shape and ta.numel() else math.nan,
            "shape": "x".join(map(str, ta.shape)) + ("" if same_shape else " vs " + "x".join(map(str, tb.shape))),
        })
    df = pd.DataFrame(rows)
    df["layer"] = df["layer"].astype("Int64")
    return df


#: Components with rows per token that a flipped expert choice changes by O(1) in that token's rows.
ROUTED = ("router", "moe.mlp1", "moe.mlp2", "moe", "residual")
#: Share of a layer's tokens that near ties may flip (routing_agreement); more is a router that decides
#: differently, not drift before it.
FLIP_TOL = 0.05


def routing_agreement(a: Capture, b: Capture, layer: int, ordered: bool = False) -> torch.Tensor | None:
    """Per token of `layer`: whether both runs picked the same experts (None without both router captures);
    ordered: in the same slot order too (by gate, as top-k ranks them), for per-assignment rows [T, k, ...].

    Why: any change of arithmetic before a router (bf16 against fp32 intermediates) flips the top-k of the
    tokens whose k-th and (k+1)-th logits nearly tie; such a token's gates, MoE output and residual then
    differ by O(1) in both correct models, and the more tokens, the likelier a tie (2 of 256 in the tiny
    model at batch 8, prompt 32)."""
    ka = a.outputs.get((layer, "router"))
    kb = b.outputs.get((layer, "router"))
    if ka is None or kb is None or ka.shape != kb.shape:
        return None
    kb = kb.to(ka.device)
    same = ((ka != 0) == (kb != 0)).all(-1)
    if ordered and ka.numel():
        k = int((ka[0] != 0).sum())
        same &= (ka.topk(k, -1).indices == kb.topk(k, -1).indices).all(-1)
    return same


def agreed_errors(a: Capture, b: Capture, table: pd.DataFrame) -> pd.DataFrame:
    """compare()'s table plus rel_err_agreed (ROUTED components over the tokens whose routing agrees; the
    plain rel_err elsewhere), flipped and flipped_share (ROUTED rows: how many tokens that left out, and
    their share of the layer's tokens)."""
    table = table.copy()
    table["rel_err_agreed"] = table["rel_err"]
    table["flipped"] = pd.array([pd.NA] * len(table), dtype="Int64")
    table["flipped_share"] = pd.array([pd.NA] * len(table), dtype="Float64")
    for i, row in table.iterrows():
        if row["component"] not in ROUTED or pd.isna(row["layer"]):
            continue
        agree = routing_agreement(a, b, int(row["layer"]), ordered=row["component"].startswith("moe."))
        key = (int(row["layer"]), row["component"])
        ta, tb = a.outputs[key], b.outputs[key]
        if agree is None or ta.shape != tb.shape or ta.dim() < 2:
            continue
        n = agree.numel()  # tokens: router [T, E], mlp1/mlp2 per assignment [T, k, I], moe/residual [B, S, H]
        if ta.shape[0] != n and not (ta.dim() == 3 and ta.shape[0] * ta.shape[1] == n):
            continue
        agree = agree.to(ta.device)
        rows_a, rows_b = ta.reshape(n, -1), tb.reshape(n, -1)
        table.at[i, "rel_err_agreed"] = relative_error(rows_a[agree], rows_b[agree]) if agree.any() else 0.0
        table.at[i, "flipped"] = int((~agree).sum())
        table.at[i, "flipped_share"] = float((~agree).sum()) / n
    return table


def first_divergence(table: pd.DataFrame, tol: float = DEFAULT_TOL) -> dict | None:
    """The first row (execution order) whose relative error exceeds tol, or None."""
    over = table[table["rel_err"] > tol]
    if over.empty:
        return None
    row = over.sort_values("step").iloc[0].to_dict()
    row["layer"] = None if pd.isna(row["layer"]) else int(row["layer"])
    return row


@dataclass
class DivergenceReport:
    a: Variant
    b: Variant
    config: ModelConfig
    tol: float
    table: pd.DataFrame
    first: dict | None

    def summary(self) -> str:
        head = f"{self.a.label} vs {self.b.label} ({self.config.name}, tol {self.tol:g})"
        if self.first is None:
            worst = self.table["rel_err"].max()
            return f"{head}: no divergence (largest relative error {worst:.2e})"
        where = "model" if self.first["layer"] is None else f"layer {self.first['layer']}"
        out = (f"{head}: first divergence at {where}, component {self.first['component']} "
               f"(relative error {self.first['rel_err']:.3g})")
        share = self.first.get("flipped_share")
        if self.first["component"] in ROUTED and share is not None and pd.notna(share):
            if share > FLIP_TOL:
                out += (f"; {self.first['flipped']} token(s) ({share:.0%}) took other experts: too many for "
                        "close logits, the router decides differently")
            elif self.first["rel_err_agreed"] <= self.tol:
                out += (f"; {self.first['rel_err_agreed']:.3g} over the tokens routed alike: "
                        f"{self.first['flipped']} token(s) took other experts (or slot order) on a near tie that "
                        "drift before the router can flip")
        return out


def diverge(a: str | Variant, b: str | Variant, *, model: str | ModelConfig = "tiny", weights: Weights | None = None,
            tokens: torch.Tensor | None = None, batch: int = 1, seq: int = 16, seed: int = 0,
            tol: float = DEFAULT_TOL, device=None) -> DivergenceReport:
    """Compare two variants of one model on the same tokens (synthetic weights unless given)."""
    va, vb = parse_variant(a), parse_variant(b)
    base = get_config(model).replace(faults=frozenset())
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if weights is None:
        weights = synthetic_weights(base, seed=seed, device=device)
    if tokens is None:
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, base.vocab, (batch, seq), generator=g)
    caps = [capture(GptOss(base.replace(faults=v.faults), weights, v.backends), tokens) for v in (va, vb)]
    table = agreed_errors(*caps, compare(*caps))
    return DivergenceReport(va, vb, base, tol, table, first_divergence(table, tol))


def divergence_chart(report: DivergenceReport):
    """Heat map of log10 relative error per layer (x) and component (y); the first divergence is circled."""
    import plotly.graph_objects as go

    t = report.table.copy()
    t["layer_label"] = t["layer"].map(lambda v: "model" if pd.isna(v) else str(int(v)))
    comps = [c for c in CAPTURED if c in set(t["component"])]
    layers = list(dict.fromkeys(t.sort_values("step")["layer_label"]))
    z = t.pivot_table(index="component", columns="layer_label", values="rel_err", aggfunc="max")
    z = z.reindex(index=comps, columns=layers)
    logz = z.map(lambda v: math.log10(max(v, 1e-12)) if pd.notna(v) and math.isfinite(v) else (3.0 if pd.notna(v)
                                                                                                   else None))
    fig = go.Figure(go.Heatmap(z=logz.values, x=layers, y=comps, colorscale="Viridis", zmin=-8, zmax=1,
                               colorbar={"title": "log10 rel. err"},
                               customdata=z.values, hovertemplate="layer %{x}<br>%{y}<br>rel. err %{customdata:.3g}"
                                                                 "<extra></extra>"))
    if report.first is not None:
        f = report.first
        fig.add_trace(go.Scatter(x=["model" if f["layer"] is None else str(f["layer"])], y=[f["component"]],
                                 mode="markers", marker={"symbol": "circle-open", "size": 22, "color": "red",
                                                         "line": {"width": 3}}, name="first divergence"))
    fig.update_layout(title=report.summary(), xaxis_title="layer", yaxis_title="component",
                      yaxis={"autorange": "reversed"}, xaxis={"type": "category"})
    return fig


def fault_table(model: str | ModelConfig = "tiny", *, weights: Weights | None = None, reference: str = "ref",
                faults=None, tol: float = DEFAULT_TOL, **kw) -> pd.DataFrame:
    """Inject each fault into the reference variant in turn: where the finder points vs where it should."""
    base = get_config(model).replace(faults=frozenset())
    if weights is None:
        device = kw.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")
        weights = synthetic_weights(base, seed=kw.get("seed", 0), device=device)
    rows = []
    for name in faults or FAULTS:
        ref = parse_variant(reference)
        if ref.backends.moe == "triton" and name in TORCH_MOE_FAULTS:
            f = {"component": "n/a (lives inside the fused kernel; use moe=torch)"}
        else:
            faulty = Variant(f"{reference}+{name}", ref.backends, ref.faults | {name})
            f = diverge(ref, faulty, model=base, weights=weights, tol=tol, **kw).first or {}
        rows.append({"fault": name, "bug": FAULTS[name].bug, "expected": FAULTS[name].shows_in,
                     "found_layer": f.get("layer"), "found": f.get("component"), "rel_err": f.get("rel_err"),
                     "named_right": f.get("component") == FAULTS[name].shows_in})
    return pd.DataFrame(rows)
