"""A served PyTorch model whose weights are swapped in place between requests.

A small Llama-shaped torch.nn.Module, with its parameters named as vLLM names
them (qkv_proj, gate_up_proj, vocab padded to a multiple of 64), answers a
request by greedy decoding; a trainer on the reader rank produces new weights in
memory; tpreload reloads them into the module's own tensors (no copy of the
module, no new storage) and the next answer changes.

    launch/mpirun.sh 2 /usr/bin/python3 examples/python/reload_live_model.py

Each rank serves a whole replica (tp_size 1); with tensor parallelism the
module would hold its shard and its forward pass would sum over the group.
"""
import json
import math
import os
import tempfile

import torch

import tpreload

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32"}


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c["hidden_size"] // self.heads
        self.qkv_proj = torch.nn.Linear(c["hidden_size"], (self.heads + 2 * self.kv_heads) * self.hd, bias=False)
        self.o_proj = torch.nn.Linear(self.heads * self.hd, c["hidden_size"], bias=False)

    def rope(self, x):  # x: [tokens, heads, hd]
        n, d = x.shape[0], self.hd
        freqs = torch.outer(torch.arange(n, dtype=torch.float64),
                            1.0 / CONFIG["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos().float().unsqueeze(1), emb.sin().float().unsqueeze(1)
        return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin

    def forward(self, x):
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q = self.rope(q.view(n, self.heads, self.hd))
        k = self.rope(k.view(n, self.kv_heads, self.hd)).repeat_interleave(self.heads // self.kv_heads, 1)
        v = v.view(n, self.kv_heads, self.hd).repeat_interleave(self.heads // self.kv_heads, 1)
        scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(self.hd)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return self.o_proj(torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(n, -1))


class RMSNorm(torch.nn.Module):
    def __init__(self, h):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(h))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + CONFIG["rms_norm_eps"]) * self.weight


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h), RMSNorm(h)
        self.self_attn = Attention(c)
        self.mlp = torch.nn.Module()
        self.mlp.gate_up_proj = torch.nn.Linear(h, 2 * i, bias=False)
        self.mlp.down_proj = torch.nn.Linear(i, h, bias=False)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        gate, up = self.mlp.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, -1)
        return x + self.mlp.down_proj(torch.nn.functional.silu(gate) * up)


class LlamaLike(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        padded = (c["vocab_size"] + 63) // 64 * 64
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(padded, c["hidden_size"])
        self.model.layers = torch.nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.model.norm = RMSNorm(c["hidden_size"])
        self.lm_head = torch.nn.Linear(c["hidden_size"], padded, bias=False)

    @torch.no_grad()
    def generate(self, tokens, steps):
        tokens = list(tokens)
        for _ in range(steps):
            x = self.model.embed_tokens(torch.tensor(tokens))
            for layer in self.model.layers:
                x = layer(x)
            logits = self.lm_head(self.model.norm(x))[-1, : CONFIG["vocab_size"]]
            tokens.append(int(logits.argmax()))
        return tokens


def trainer_step(step):
    """New weights as a trainer holds them: full tensors under Hugging Face names."""
    c, g = CONFIG, torch.Generator().manual_seed(step)
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    out = {"model.embed_tokens.weight": torch.randn(v, h, generator=g), "lm_head.weight": torch.randn(v, h, generator=g),
           "model.norm.weight": 1 + 0.1 * torch.randn(h, generator=g)}
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        for name, shape in [("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                            ("self_attn.o_proj", (h, h)), ("mlp.gate_proj", (i, h)), ("mlp.up_proj", (i, h)),
                            ("mlp.down_proj", (h, i))]:
            out[p + name + ".weight"] = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[p + norm + ".weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    return out


def main():
    world = tpreload.World()
    config_dir = world.allgather(tempfile.mkdtemp(prefix="tpreload-live-") if world.rank == 0 else "")[0]
    if world.rank == 0:
        with open(os.path.join(config_dir, "config.json"), "w") as f:
            json.dump(CONFIG, f)
    world.barrier()
    model = LlamaLike(CONFIG)
    params = dict(model.named_parameters())
    storage = {n: p.data_ptr() for n, p in params.items()}
    request = [1, 42, 7]
    workspace = tpreload.Workspace()
    answers = []
    for step in (1, 2):
        weights = list(trainer_step(step).items()) if world.rank == 0 else None
        with torch.no_grad():
            result = tpreload.reload_weights(params, config_dir, world=world, tp_size=1, weights_iterator=weights,
                                             workspace=workspace, fingerprint=True)
        answers.append(model.generate(request, 6))
        if world.rank == 0:
            print("step %d: reloaded %d parameters in %.3f s (fingerprint %s); answer to %s: %s"
                  % (step, len(result.loaded), result.seconds["total"], result.fingerprint, request, answers[-1]))
    moved = [n for n, p in model.named_parameters() if p.data_ptr() != storage[n]]
    same = len(set(world.allgather(str(answers)))) == 1
    if world.rank == 0:
        print("answers changed with the weights: %s; every replica answered alike: %s; parameters stayed in place: %s"
              % ("yes" if answers[0] != answers[1] else "NO", "yes" if same else "NO", "yes" if not moved else "NO"))
    world.barrier()
    if world.rank == 0:
        os.remove(os.path.join(config_dir, "config.json"))
        os.rmdir(config_dir)
    return 0 if answers[0] != answers[1] and same and not moved else 1


if __name__ == "__main__":
    raise SystemExit(main())
