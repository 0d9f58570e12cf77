"""Shared by the Python tests, which run under mpirun (every rank runs pytest)."""
import json
import os
import shutil
import struct
import tempfile

import pytest
import torch

import tpreload

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 100,
          "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@pytest.fixture(scope="session")
def world():
    return tpreload.World()


@pytest.fixture
def shared_dir(world):
    """A directory every rank sees, made by rank 0, removed after the test."""
    mine = tempfile.mkdtemp(prefix="tpreload-py-") if world.rank == 0 else ""
    path = world.allgather(mine)[0]
    yield path
    world.barrier()
    if world.rank == 0:
        shutil.rmtree(path)


def checkpoint(seed, dtype=torch.bfloat16):
    """Every tensor of a Hugging Face checkpoint for CONFIG, seeded."""
    c = CONFIG
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    gen = torch.Generator().manual_seed(seed)
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
    return {n: (torch.randn(s, generator=gen) * 0.1).to(dtype) for n, s in sorted(shapes.items())}


def expected_shards(ckpt, tp, r):
    """What tp rank r of tp holds, sliced here by vLLM's rules (written for the tests)."""
    c = CONFIG
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    hd = h // heads
    q_local, i_local = heads // tp * hd, inter // tp
    kv_first = r * kv_heads // tp if tp >= kv_heads else r * (kv_heads // tp)
    kv_count = 1 if tp >= kv_heads else kv_heads // tp
    padded = (v + 63) // 64 * 64
    per = padded // tp

    def vocab(t):
        out = torch.zeros((per, t.shape[1]), dtype=t.dtype)
        start, end = r * per, min(v, r * per + per)
        if end > start:
            out[: end - start] = t[start:end]
        return out

    out = {"model.embed_tokens.weight": vocab(ckpt["model.embed_tokens.weight"]),
           "lm_head.weight": vocab(ckpt["lm_head.weight"]), "model.norm.weight": ckpt["model.norm.weight"]}
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        out[p + "input_layernorm.weight"] = ckpt[p + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = ckpt[p + "post_attention_layernorm.weight"]
        kv_rows = slice(kv_first * hd, (kv_first + kv_count) * hd)
        out[p + "self_attn.qkv_proj.weight"] = torch.cat([
            ckpt[p + "self_attn.q_proj.weight"][r * q_local:(r + 1) * q_local],
            ckpt[p + "self_attn.k_proj.weight"][kv_rows], ckpt[p + "self_attn.v_proj.weight"][kv_rows]])
        out[p + "self_attn.o_proj.weight"] = ckpt[p + "self_attn.o_proj.weight"][:, r * q_local:(r + 1) * q_local]
        out[p + "mlp.gate_up_proj.weight"] = torch.cat([
            ckpt[p + "mlp.gate_proj.weight"][r * i_local:(r + 1) * i_local],
            ckpt[p + "mlp.up_proj.weight"][r * i_local:(r + 1) * i_local]])
        out[p + "mlp.down_proj.weight"] = ckpt[p + "mlp.down_proj.weight"][:, r * i_local:(r + 1) * i_local]
    return {n: t.contiguous() for n, t in out.items()}


def raw_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.element_size() == 1 else \
        t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32 if t.element_size() == 4
                            else torch.int64).numpy().tobytes()


def write_safetensors(path, tensors):
    """The safetensors format, written here: an 8-byte header size, a JSON header, the data."""
    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        data = raw_bytes(t)
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_model_dir(path, tensors):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    write_safetensors(os.path.join(path, "model.safetensors"), tensors)
    return path
