"""Checkpoint loaders: tiny checkpoints written with each format's own writer load back exactly.

The writers here spell every tensor name out (independently of labkit.model.loaders' plans), so a wrong name,
a wrong gate/up interleave or a wrong nibble order in the loader fails these tests.
"""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from kernels import dequantize_mxfp4, to_ggml_bytes
from labkit.model import GptOss, get_config, load_checkpoint, synthetic_weights
from labkit.model.loaders import detect_format

gguf = pytest.importorskip("gguf")  # a project requirement; absent on the device machine, where this file skips

CFG = get_config("tiny", layers=2)


@pytest.fixture(scope="module")
def weights():
    return synthetic_weights(CFG, seed=3)


def openai_tensors(w) -> dict:
    out = {"embedding.weight": w.embedding, "norm.scale": w.norm, "unembedding.weight": w.unembedding}
    for n, lw in enumerate(w.layers):
        p = f"block.{n}"
        out.update({
            f"{p}.attn.norm.scale": lw.attn_norm, f"{p}.attn.qkv.weight": lw.qkv_w, f"{p}.attn.qkv.bias": lw.qkv_b,
            f"{p}.attn.sinks": lw.sinks.bfloat16(), f"{p}.attn.out.weight": lw.out_w, f"{p}.attn.out.bias": lw.out_b,
            f"{p}.mlp.norm.scale": lw.mlp_norm, f"{p}.mlp.gate.weight": lw.gate_w, f"{p}.mlp.gate.bias": lw.gate_b,
            f"{p}.mlp.mlp1_weight.blocks": lw.w1.blocks, f"{p}.mlp.mlp1_weight.scales": lw.w1.scales,
            f"{p}.mlp.mlp1_bias": lw.b1.bfloat16(),
            f"{p}.mlp.mlp2_weight.blocks": lw.w2.blocks, f"{p}.mlp.mlp2_weight.scales": lw.w2.scales,
            f"{p}.mlp.mlp2_bias": lw.b2.bfloat16(),
        })
    return {k: v.contiguous() for k, v in out.items()}


def hf_tensors(w) -> dict:
    c = CFG
    qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
    out = {"model.embed_tokens.weight": w.embedding, "model.norm.weight": w.norm, "lm_head.weight": w.unembedding}
    for n, lw in enumerate(w.layers):
        p = f"model.layers.{n}"
        q, k, v = lw.qkv_w.split([qd, kd, kd])
        qb, kb, vb = lw.qkv_b.split([qd, kd, kd])
        out.update({
            f"{p}.input_layernorm.weight": lw.attn_norm,
            f"{p}.self_attn.q_proj.weight": q, f"{p}.self_attn.k_proj.weight": k, f"{p}.self_attn.v_proj.weight": v,
            f"{p}.self_attn.q_proj.bias": qb, f"{p}.self_attn.k_proj.bias": kb, f"{p}.self_attn.v_proj.bias": vb,
            f"{p}.self_attn.o_proj.weight": lw.out_w, f"{p}.self_attn.o_proj.bias": lw.out_b,
            f"{p}.self_attn.sinks": lw.sinks,
            f"{p}.post_attention_layernorm.weight": lw.mlp_norm,
            f"{p}.mlp.router.weight": lw.gate_w, f"{p}.mlp.router.bias": lw.gate_b,
            f"{p}.mlp.experts.gate_up_proj_blocks": lw.w1.blocks, f"{p}.mlp.experts.gate_up_proj_scales": lw.w1.scales,
            f"{p}.mlp.experts.gate_up_proj_bias": lw.b1.bfloat16(),
            f"{p}.mlp.experts.down_proj_blocks": lw.w2.blocks, f"{p}.mlp.experts.down_proj_scales": lw.w2.scales,
            f"{p}.mlp.experts.down_proj_bias": lw.b2.bfloat16(),
        })
    return {k: v.contiguous() for k, v in out.items()}


def write_gguf(w, path, *, skip=(), extra=None, gate_type=None):
    """llama.cpp's gpt-oss layout: gate and up split (even / odd rows of mlp1), experts MXFP4 in ggml order."""
    c = CFG
    qd, kd = c.q_heads * c.head_dim, c.kv_heads * c.head_dim
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    writer.add_block_count(c.layers)

    def f32(t):
        return t.float().numpy()

    def bf16(t):  # raw BF16 bytes
        return t.bfloat16().contiguous().view(torch.int16).numpy().view(np.uint8)

    def mx(q):
        return to_ggml_bytes(q).flatten(-2).numpy()

    tensors = {"token_embd.weight": (bf16(w.embedding), gguf.GGMLQuantizationType.BF16),
               "output_norm.weight": (f32(w.norm), None), "output.weight": (bf16(w.unembedding),
                                                                           gguf.GGMLQuantizationType.BF16)}
    for n, lw in enumerate(w.layers):
        p = f"blk.{n}"
        q, k, v = lw.qkv_w.split([qd, kd, kd])
        qb, kb, vb = lw.qkv_b.split([qd, kd, kd])
        tensors.update({
            f"{p}.attn_norm.weight": (f32(lw.attn_norm), None),
            f"{p}.attn_q.weight": (f32(q), None), f"{p}.attn_k.weight": (f32(k), None),
            f"{p}.attn_v.weight": (f32(v), None),
            f"{p}.attn_q.bias": (f32(qb), None), f"{p}.attn_k.bias": (f32(kb), None),
            f"{p}.attn_v.bias": (f32(vb), None),
            f"{p}.attn_output.weight": (f32(lw.out_w), None), f"{p}.attn_output.bias": (f32(lw.out_b), None),
            f"{p}.attn_sinks.weight": (f32(lw.sinks), None),
            f"{p}.post_attention_norm.weight": (f32(lw.mlp_norm), None),
            f"{p}.ffn_gate_inp.weight": (f32(lw.gate_w), None), f"{p}.ffn_gate_inp.bias": (f32(lw.gate_b), None),
            f"{p}.ffn_gate_exps.weight": (mx(lw.w1[:, 0::2]), gguf.GGMLQuantizationType.MXFP4),
            f"{p}.ffn_up_exps.weight": (mx(lw.w1[:, 1::2]), gguf.GGMLQuantizationType.MXFP4),
            f"{p}.ffn_gate_exps.bias": (f32(lw.b1[:, 0::2]), None),
            f"{p}.ffn_up_exps.bias": (f32(lw.b1[:, 1::2]), None),
            f"{p}.ffn_down_exps.weight": (mx(lw.w2), gguf.GGMLQuantizationType.MXFP4),
            f"{p}.ffn_down_exps.bias": (f32(lw.b2), None),
        })
    if gate_type is not None:
        tensors["blk.0.ffn_gate_exps.weight"] = (f32(dequantize_mxfp4(w.layers[0].w1[:, 0::2])), None)
    tensors.update(extra or {})
    for name, (data, raw) in tensors.items():
        if name not in skip:
            writer.add_tensor(name, np.ascontiguousarray(data), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_same_weights(a, b):
    na, nb = a.named(), b.named()
    assert na.keys() == nb.keys()
    for k in na:
        x, y = na[k], nb[k]
        if hasattr(x, "blocks"):
            assert torch.equal(dequantize_mxfp4(x), dequantize_mxfp4(y)), k
        else:
            assert x.dtype == y.dtype and torch.equal(x, y), k


def assert_same_forward(a, b):
    toks = torch.arange(10).view(1, 10) % CFG.vocab
    la = GptOss(CFG, a).forward(toks, GptOss(CFG, a).new_cache(1, 10), all_logits=True)
    lb = GptOss(CFG, b).forward(toks, GptOss(CFG, b).new_cache(1, 10), all_logits=True)
    assert torch.equal(la, lb)


@pytest.mark.parametrize("fmt", ["openai", "hf"])
def test_safetensors_round_trip(weights, tmp_path, fmt):
    path = tmp_path / "model.safetensors"
    save_file(openai_tensors(weights) if fmt == "openai" else hf_tensors(weights), str(path))
    assert detect_format(path) == fmt
    loaded = load_checkpoint(path, CFG)
    assert_same_weights(weights, loaded)
    assert_same_forward(weights, loaded)


def test_safetensors_directory_of_shards(weights, tmp_path):
    t = openai_tensors(weights)
    names = sorted(t)
    save_file({k: t[k] for k in names[: len(names) // 2]}, str(tmp_path / "model-00001.safetensors"))
    save_file({k: t[k] for k in names[len(names) // 2:]}, str(tmp_path / "model-00002.safetensors"))
    assert_same_weights(weights, load_checkpoint(tmp_path, CFG))


def test_gguf_round_trip(weights, tmp_path):
    path = write_gguf(weights, tmp_path / "tiny.gguf")
    loaded = load_checkpoint(path, CFG)
    assert_same_weights(weights, loaded)
    assert_same_forward(weights, loaded)


def test_gguf_experts_match_the_gguf_package_dequantizer(weights, tmp_path):
    """An independent decoder (gguf.quants) reads the same numbers from the file as our loader."""
    path = write_gguf(weights, tmp_path / "tiny.gguf")
    reader = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    t = reader["blk.1.ffn_up_exps.weight"]
    theirs = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    ours = dequantize_mxfp4(load_checkpoint(path, CFG).layers[1].w1)[:, 1::2]
    assert np.array_equal(theirs, ours.numpy())


@pytest.mark.parametrize("fmt, drop, message", [
    ("openai", "block.1.mlp.mlp1_weight.scales",
     "block.1.mlp.mlp1_weight.blocks has no matching scales tensor block.1.mlp.mlp1_weight.scales"),
    ("openai", "block.0.mlp.mlp2_weight.blocks", "block.0.mlp.mlp2_weight.scales has no matching blocks tensor"),
    ("openai", "block.0.attn.sinks", "missing tensor block.0.attn.sinks"),
    ("hf", "model.layers.0.mlp.experts.gate_up_proj_scales",
     "model.layers.0.mlp.experts.gate_up_proj_blocks has no matching scales"),
    ("hf", "model.layers.1.self_attn.k_proj.weight", "missing tensor model.layers.1.self_attn.k_proj.weight"),
])
def test_safetensors_missing_tensor_is_named(weights, tmp_path, fmt, drop, message):
    t = openai_tensors(weights) if fmt == "openai" else hf_tensors(weights)
    del t[drop]
    save_file(t, str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match=message):
        load_checkpoint(tmp_path / "m.safetensors", CFG)


def test_wrong_shape_and_unknown_tensor_are_named(weights, tmp_path):
    t = openai_tensors(weights)
    t["block.0.mlp.gate.weight"] = t["block.0.mlp.gate.weight"][:-1].contiguous()
    save_file(t, str(tmp_path / "a.safetensors"))
    with pytest.raises(ValueError, match=r"block.0.mlp.gate.weight: shape \(7, 64\) but the config expects \(8, 64\)"):
        load_checkpoint(tmp_path / "a.safetensors", CFG)

    t = openai_tensors(weights)
    t["block.0.mlp.mlp1_weight.scales"] = t["block.0.mlp.mlp1_weight.scales"][:, :-1].contiguous()
    save_file(t, str(tmp_path / "b.safetensors"))
    with pytest.raises(ValueError, match=r"block.0.mlp.mlp1_weight.scales: shape \(8, 127, 2\)"):
        load_checkpoint(tmp_path / "b.safetensors", CFG)

    t = openai_tensors(weights)
    t["block.0.attn.rotary.inv_freq"] = torch.ones(8)
    save_file(t, str(tmp_path / "c.safetensors"))
    with pytest.raises(ValueError, match="unknown tensor block.0.attn.rotary.inv_freq"):
        load_checkpoint(tmp_path / "c.safetensors", CFG, format="openai")

    # a checkpoint for a bigger model: the first extra layer is named
    save_file(openai_tensors(weights), str(tmp_path / "d.safetensors"))
    with pytest.raises(ValueError, match="unknown tensor block.1"):
        load_checkpoint(tmp_path / "d.safetensors", CFG.replace(layers=1))


def test_gguf_errors_are_named(weights, tmp_path):
    path = write_gguf(weights, tmp_path / "a.gguf", skip={"blk.1.ffn_up_exps.weight"})
    with pytest.raises(ValueError, match="missing tensor blk.1.ffn_up_exps.weight"):
        load_checkpoint(path, CFG)
    path = write_gguf(weights, tmp_path / "b.gguf", extra={"blk.0.attn_rot.weight": (np.ones(4, np.float32), None)})
    with pytest.raises(ValueError, match="unknown tensor blk.0.attn_rot.weight"):
        load_checkpoint(path, CFG)
    path = write_gguf(weights, tmp_path / "c.gguf", gate_type="f32")
    with pytest.raises(TypeError, match="blk.0.ffn_gate_exps.weight: expected an MXFP4 tensor, got GGUF type F32"):
        load_checkpoint(path, CFG)
    with pytest.raises(ValueError, match=r"blk.0.ffn_gate_exps.weight: shape \(8, 64, 64\) but the config expects "
                                         r"\(8, 128, 64\)"):
        load_checkpoint(write_gguf(weights, tmp_path / "d.gguf"), CFG.replace(intermediate=128))


def test_format_detection_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nope.safetensors", CFG)
    save_file({"foo": torch.ones(2)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="cannot tell the checkpoint format"):
        load_checkpoint(tmp_path / "x.safetensors", CFG)
