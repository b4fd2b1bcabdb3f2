"""Parity: how far a model variant (kernels, W4A8, an MXFP4 lm_head) lands from the reference model.

`model_parity` runs both models on the same token ids and reports the relative error of every component
per layer plus the final logits' top-1 agreement and KL divergence. `lm_head_study` isolates the lm_head:
the same final hidden states through the BF16 weight and through its MXFP4 (each scale rule), NVFP4 and
W4A8 (MXFP8 activations x MXFP4 weights) versions, all in fp32 reference math; a kernel path plugs in as
one more entry of `lm_head_variants`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from kernels import ROUNDINGS, dequantize_mxfp8, dequantize_nvfp4, quantize_mxfp8, quantize_nvfp4

from .backends import dequantize_rows, quantize_rows
from .diverge import agreed_errors, capture, compare
from .model import GptOss


def logit_metrics(ref: torch.Tensor, test: torch.Tensor) -> dict:
    """Top-1 agreement, mean KL(ref || test) in nats, max |logit error| and relative error over [..., V]."""
    r = ref.reshape(-1, ref.shape[-1]).to(torch.float64)
    t = test.reshape(-1, test.shape[-1]).to(ref.device, torch.float64)  # the two runs may be on two devices
    lp_r, lp_t = torch.log_softmax(r, -1), torch.log_softmax(t, -1)
    kl = (lp_r.exp() * (lp_r - lp_t)).sum(-1)
    return {
        "top1_agree": (r.argmax(-1) == t.argmax(-1)).to(torch.float64).mean().item(),
        "kl": kl.mean().item(),
        "max_logit_err": (t - r).abs().max().item(),
        "rel_err": ((t - r).norm() / r.norm()).item(),
    }


@dataclass
class ParityReport:
    #: step, layer, component, rel_err, max_abs_err, shape; rel_err_agreed (ROUTED components: over the
    #: tokens whose experts both runs picked in that layer) and flipped (how many tokens that left out)
    per_component: pd.DataFrame
    logits: dict  # logit_metrics of the final logits

    def per_layer(self) -> pd.DataFrame:
        """Relative error per layer (rows) and component (columns)."""
        t = self.per_component.dropna(subset=["layer"])
        return t.pivot_table(index="layer", columns="component", values="rel_err", sort=False)


def model_parity(reference: GptOss, test: GptOss, tokens: torch.Tensor) -> ParityReport:
    """Same token ids [B, T] through both models; errors of every component and of the final logits."""
    a, b = capture(reference, tokens), capture(test, tokens)
    return ParityReport(agreed_errors(a, b, compare(a, b)),
                        logit_metrics(a.outputs[(None, "logits")], b.outputs[(None, "logits")]))


def final_hidden(model: GptOss, tokens: torch.Tensor) -> torch.Tensor:
    """The lm_head's input for every position: final-norm hidden states [B * T, H] (model dtype)."""
    out = {}
    with model.add_hook(lambda layer, name, t: out.setdefault(name, t.detach().clone()) if name == "final_norm"
                        else None), torch.inference_mode():
        tokens = tokens.to(model.device)
        model.forward(tokens, model.new_cache(*tokens.shape), all_logits=True)
    return out["final_norm"].reshape(-1, model.config.hidden)


def lm_head_variants(weight: torch.Tensor, roundings=ROUNDINGS, w4a8_rounding: str = "floor") -> dict[str, dict]:
    """name -> {fn: hidden [N, H] -> fp32 logits, weights, activations, bits}; fp32 reference math throughout.

    Each fn quantizes and dequantizes the weight when called, so only one dense fp32 copy of a 201088-row
    lm_head exists at a time.
    """

    def w4(rounding):
        return lambda: dequantize_rows(quantize_rows(weight, rounding), torch.float32)

    def linear(dense_w, act=lambda h: h.to(torch.float32)):
        return lambda h: act(h) @ dense_w().T

    def mxfp8(h):
        return dequantize_mxfp8(quantize_mxfp8(h.to(torch.float32)))

    out = {"bf16": {"fn": linear(lambda: weight.to(torch.float32)), "weights": "bf16", "activations": "bf16",
                    "bits": 16.0}}
    for r in roundings:
        out[f"mxfp4/{r}"] = {"fn": linear(w4(r)), "weights": f"mxfp4/{r}", "activations": "bf16", "bits": 4.25}
    out["nvfp4"] = {"fn": linear(lambda: dequantize_nvfp4(quantize_nvfp4(weight))), "weights": "nvfp4",
                    "activations": "bf16", "bits": 4.5}
    out[f"w4a8 mxfp4/{w4a8_rounding}"] = {"fn": linear(w4(w4a8_rounding), mxfp8), "weights": f"mxfp4/{w4a8_rounding}",
                                          "activations": "mxfp8", "bits": 4.25}
    return out


def lm_head_study(hidden: torch.Tensor, weight: torch.Tensor, variants: dict | None = None) -> pd.DataFrame:
    """Every lm_head variant against the BF16 weight on the same hidden states [N, H]: one row each."""
    variants = variants or lm_head_variants(weight)
    ref = variants["bf16"]["fn"](hidden) if "bf16" in variants else hidden.to(torch.float32) @ weight.float().T
    rows = []
    for name, v in variants.items():
        rows.append({"variant": name, "weights": v["weights"], "activations": v["activations"],
                     "bits_per_weight": v["bits"], **logit_metrics(ref, v["fn"](hidden))})
    return pd.DataFrame(rows)


def lm_head_chart(study: pd.DataFrame, title: str = "lm_head variants vs BF16 on the same hidden states"):
    """Top-1 agreement and KL per lm_head variant (two panels)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    s = study[study["variant"] != "bf16"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("top-1 agreement with BF16", "KL(bf16 || variant), nats"))
    fig.add_trace(go.Bar(x=s["variant"], y=s["top1_agree"], name="top-1"), row=1, col=1)
    fig.add_trace(go.Bar(x=s["variant"], y=s["kl"], name="KL"), row=1, col=2)
    fig.update_layout(title=title, showlegend=False)
    return fig


def per_layer_chart(report: ParityReport, title: str):
    """Relative error of each component per layer (lines, log scale)."""
    import plotly.express as px

    t = report.per_component.dropna(subset=["layer"]).copy()
    t["rel_err"] = t["rel_err"].clip(lower=1e-12)
    fig = px.line(t, x="layer", y="rel_err", color="component", markers=True, log_y=True, title=title,
                  labels={"rel_err": "relative error vs reference"})
    return fig
