"""The GPT-OSS decode setup the decode probes share (decode_flags, route_bound, capture_modes): a synthetic model
loaded once and prefilled, then graph decode steps timed as labkit.model.profile times them, each capture afresh
from the same cache position and first token. Imported by the probes in this folder."""

import statistics

import torch

from labkit.model.backends import resolve_backends
from labkit.model.config import get_config
from labkit.model.graph import DecodeRunner
from labkit.model.profile import _percentile, _time_decode, load_model


def prefilled(model: str, layout: str = "rows+nib", batch: int = 1, prompt: int = 512, decode: int = 64,
              device: str = "cuda"):
    """(model, cache, first ids): the model with the MXFP4 lm_head, a cache holding `prompt` random tokens of
    `batch` sequences (room for `decode` more), and the ids the prefill sampled."""
    dev = torch.device(device)
    m = load_model(get_config(model), "synthetic", resolve_backends("auto", "mxfp4", "floor", dev, "auto", layout),
                   device=dev)
    ids = torch.randint(0, m.config.vocab, (batch, prompt), generator=torch.Generator().manual_seed(0)).to(dev)
    cache = m.new_cache(batch, prompt + decode + 8)
    return m, cache, m.prefill(ids, cache).argmax(-1)


def timed_capture(m, cache, first, prompt: int, decode: int) -> tuple[dict, list[int]]:
    """A fresh capture of the decode step from position `prompt` and ids `first`, `decode` steps timed:
    ({step_us, step_p10, step_p90}, the first sequence's ids)."""
    cache.reset(prompt)
    runner = DecodeRunner(m, cache)
    times, ids = _time_decode(runner, first, decode, m.device)
    del runner
    return {"step_us": statistics.median(times), "step_p10": _percentile(times, 0.1),
            "step_p90": _percentile(times, 0.9)}, ids
