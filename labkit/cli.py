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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"labkit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
