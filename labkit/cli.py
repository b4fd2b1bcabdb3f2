"""`labkit` command line. Each subcommand is a thin wrapper over a labkit function."""

from __future__ import annotations

import argparse
import json
import sys


def cmd_info(args) -> int:
    """Print versions, the GPU (or its absence) and how Triton runs."""
    from .env import environment

    env = environment()
    if args.json:
        print(json.dumps(env, indent=2, default=str))
        return 0
    gpu = env["gpu"] or "none (kernels run on the CPU through the Triton interpreter)"
    rows = [
        ("python", env["python"]),
        ("gpu", gpu),
    ]
    if env["gpu"]:
        rows += [("sm_count", env["sm_count"]), ("l2", f"{env['l2_bytes'] / 2**20:.0f} MiB" if env["l2_bytes"] else "?"),
                 ("capability", env["capability"]), ("driver", env["driver"]), ("cuda", env["cuda"])]
    rows += [("triton", f"{env['triton']} ({env['triton_mode']})")]
    rows += [(p, env[p] or "not installed") for p in ("torch", "numpy", "pandas", "pyarrow", "plotly", "papermill", "nvtx")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def cmd_quickstart(args) -> int:
    """The README's main job: run the lab's default notebooks into a new run folder and say where it is."""
    from .quickstart import quickstart

    quickstart(out=args.out)
    return 0


def cmd_model_profile(args) -> int:
    """Decode profile of a GPT-OSS model: load, prefill, TTFT, tok/s, breakdown; stored as a run."""
    from .model.profile import profile_decode, store_profile

    result = profile_decode(args.model, weights=args.weights, batch=args.batch, prompt=args.prompt,
                            decode=args.decode, moe=args.moe, lm_head=args.lm_head, rounding=args.rounding,
                            seed=args.seed, device=args.device, profile_steps=args.profile_steps, nvtx=args.nvtx,
                            check=not args.no_check)
    print(result.summary())
    path = store_profile(result, out=args.out)
    print(f"run folder: {path}")
    return 0


def cmd_model_diverge(args) -> int:
    """Run two model variants on the same tokens; report the first component and layer that diverges."""
    import torch

    from .charts import save_figure
    from .model import get_config
    from .model.diverge import diverge, divergence_chart
    from .model.loaders import load_weights
    from .runs import create_run, write_json_atomic

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    weights = load_weights(get_config(args.model), args.weights, seed=args.seed, device=device)
    report = diverge(args.a, args.b, model=args.model, weights=weights, batch=args.batch, seq=args.seq,
                     seed=args.seed, tol=args.tol, device=device)
    with_layer = report.table.assign(layer=report.table["layer"].astype("string").fillna("-"))
    print(with_layer[["layer", "component", "rel_err", "max_abs_err"]].to_string(index=False, float_format="%.3g"))
    print(report.summary())
    run = create_run(f"model-diverge-{args.model}", out=args.out, parameters={
        "a": args.a, "b": args.b, "model": args.model, "weights": args.weights, "batch": args.batch,
        "seq": args.seq, "seed": args.seed, "tol": args.tol})
    report.table.to_csv(run.path / "divergence.csv", index=False)
    write_json_atomic(run.path / "divergence.json", {"summary": report.summary(), "first": report.first})
    save_figure(divergence_chart(report), run.path, "divergence")
    run.finish()
    print(f"run folder: {run.path}")
    return 1 if report.first is not None else 0


def _add_model_parser(sub) -> None:
    from kernels import ROUNDINGS

    from .model.backends import LM_HEAD_BACKENDS, MOE_BACKENDS
    from .model.config import PRESETS

    model = sub.add_parser("model", help="GPT-OSS model runs: decode profile, divergence finder")
    msub = model.add_subparsers(dest="model_command", metavar="MODEL_COMMAND", required=True)

    def common(p):
        p.add_argument("--model", default="tiny", choices=list(PRESETS), help="model preset (default: tiny)")
        p.add_argument("--weights", default="synthetic",
                       help="'synthetic' (seeded random, any size) or a checkpoint: OpenAI/HF safetensors, GGUF")
        p.add_argument("--batch", type=int, default=1)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
        p.add_argument("--out", help="run folder to write (default: results/<run_id>)")

    p = msub.add_parser("profile", help="load time, prefill, TTFT, decode tok/s, per-component share of decode")
    common(p)
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--decode", type=int, default=64, help="decode steps timed (default 64)")
    p.add_argument("--moe", default="auto", choices=["auto", *MOE_BACKENDS],
                   help="MoE backend (auto: triton on a GPU, torch on a CPU)")
    p.add_argument("--lm-head", default="auto", choices=["auto", *LM_HEAD_BACKENDS],
                   help="lm_head backend (auto: mxfp4 kernel on a GPU, mxfp4-torch on a CPU)")
    p.add_argument("--rounding", default="floor", choices=list(ROUNDINGS), help="MXFP4 scale rule of the lm_head")
    p.add_argument("--profile-steps", type=int, default=3, help="eager decode steps under torch.profiler")
    p.add_argument("--nvtx", action="store_true", help="emit NVTX ranges (domain mxfp4lab) for Nsight Systems")
    p.add_argument("--no-check", action="store_true", help="skip the parity check against the torch reference")
    p.set_defaults(func=cmd_model_profile)

    p = msub.add_parser("diverge", help="first component and layer where two model variants differ "
                                        "(exit 1 when they do)")
    p.add_argument("a", help="variant A, e.g. ref, kernels, moe=torch,lm_head=mxfp4-torch")
    p.add_argument("b", help="variant B, e.g. kernels or a fault name such as gqa_mod")
    common(p)
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence (default 16)")
    p.add_argument("--tol", type=float, default=0.05, help="relative error that counts as divergence")
    p.set_defaults(func=cmd_model_diverge)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="labkit",
        description="MXFP4 performance lab: kernels, rooflines, sweeps and GPT-OSS runs, measured on your GPU.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("info", help="versions, GPU, and whether Triton runs compiled or interpreted")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("quickstart", help="the default job: run the lab's notebooks into a new run folder")
    p.add_argument("--out", help="run folder to write (default: results/<run_id>)")
    p.set_defaults(func=cmd_quickstart)

    _add_model_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, KeyError, ImportError) as e:
        command = " ".join(filter(None, [args.command, getattr(args, "model_command", None)]))
        print(f"labkit {command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
