"""tpreload's Python module under mpirun: borrowed tensors reloaded in place,
byte for byte against an independent slicing written in conftest.py."""
import os

import pytest
import torch

import tpreload
from conftest import CONFIG, checkpoint, expected_shards, write_model_dir


def zeros_like_shards(world, tp):
    """This rank's parameters: zeros with the shapes of its shards."""
    shapes = expected_shards(checkpoint(0), tp, world.rank % tp)
    return {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in shapes.items()}


def assert_holds(params, want, what):
    for name, t in want.items():
        assert torch.equal(params[name].view(torch.int16), t.view(torch.int16)), "%s: %s differs" % (what, name)


@pytest.mark.parametrize("distribution", ["scatter", "broadcast"])
def test_reload_in_place_from_safetensors(world, shared_dir, distribution):
    tp = world.size
    v1, v2 = checkpoint(1), checkpoint(2)
    if world.rank == 0:
        write_model_dir(os.path.join(shared_dir, "v1"), v1)
        write_model_dir(os.path.join(shared_dir, "v2"), v2)
    world.barrier()
    params = zeros_like_shards(world, tp)
    pointers = {n: t.data_ptr() for n, t in params.items()}
    r = tpreload.reload_weights(params, os.path.join(shared_dir, "v1"), world=world, distribution=distribution,
                                bucket_mb=0.01)
    assert r.complete and not r.skipped
    assert_holds(params, expected_shards(v1, tp, world.rank), "v1")
    r = tpreload.reload_weights(params, os.path.join(shared_dir, "v1", "config.json"), world=world,
                                weights_path=os.path.join(shared_dir, "v2"), distribution=distribution)
    assert r.complete
    assert_holds(params, expected_shards(v2, tp, world.rank), "v2")
    assert {n: t.data_ptr() for n, t in params.items()} == pointers, "a parameter moved"
    assert r.seconds["total"] > 0 and r.bytes_transferred > 0
    assert len(set(world.allgather(r.fingerprint))) == 1, "ranks disagree on the fingerprint"


def test_reload_from_hdf5(world, shared_dir):
    h5py = pytest.importorskip("h5py")
    tp = world.size
    ckpt = checkpoint(3)
    path = os.path.join(shared_dir, "model.h5")
    if world.rank == 0:
        write_model_dir(shared_dir, {})  # config.json only (and an empty safetensors file)
        os.remove(os.path.join(shared_dir, "model.safetensors"))
        with h5py.File(path, "w") as f:  # bfloat16 as uint16 with dtype="bfloat16", as tpreload reads it
            for name, t in ckpt.items():
                d = f.create_dataset(name, data=t.view(torch.int16).numpy().view("uint16"))
                d.attrs["dtype"] = "bfloat16"
    world.barrier()
    params = zeros_like_shards(world, tp)
    r = tpreload.reload_weights(params, shared_dir, world=world, weights_path=path)
    assert r.complete
    assert_holds(params, expected_shards(ckpt, tp, world.rank), "hdf5")


def test_weights_iterator_in_both_formats(world, shared_dir):
    tp = world.size
    if world.rank == 0:
        write_model_dir(shared_dir, {})
    world.barrier()
    config = os.path.join(shared_dir, "config.json")
    ckpt = checkpoint(4)
    params = zeros_like_shards(world, tp)
    # Checkpoint format: Hugging Face names and full tensors, float32 into the bfloat16 model.
    full = {n: t.float() * 1.5 for n, t in ckpt.items()}
    it = list(full.items()) if world.rank == 0 else None
    assert tpreload.reload_weights(params, config, world=world, weights_iterator=it).complete
    want = {n: t.to(torch.bfloat16) for n, t in full.items()}
    assert_holds(params, expected_shards(want, tp, world.rank), "iterator, checkpoint format")
    # Kernel format: every rank's shards in the serving layout, tagged with the rank.
    ckpt = checkpoint(5)
    it = None
    if world.rank == 0:
        it = [(n, t, r) for r in range(tp) for n, t in expected_shards(ckpt, tp, r).items()]
    r = tpreload.reload_weights(params, config, world=world, weights_iterator=it, is_checkpoint_format=False)
    assert r.complete
    assert_holds(params, expected_shards(ckpt, tp, world.rank), "iterator, kernel format")


def test_mismatched_parameters_are_refused_on_every_rank(world, shared_dir):
    tp = world.size
    if world.rank == 0:
        write_model_dir(shared_dir, checkpoint(6))
    world.barrier()
    params = zeros_like_shards(world, tp)
    del params["model.norm.weight"]
    params["model.layers.1.mlp.down_proj.weight"] = torch.zeros((64, 3), dtype=torch.bfloat16)
    params["model.layers.0.self_attn.o_proj.weight"] = params["model.layers.0.self_attn.o_proj.weight"].float()
    with pytest.raises(tpreload.ValidationError) as error:
        tpreload.reload_weights(params, shared_dir, world=world)
    message = str(error.value)
    assert "missing parameter 'model.norm.weight'" in message
    assert "'model.layers.1.mlp.down_proj.weight': expected [64, %d] bfloat16, got [64, 3] bfloat16" % (128 // tp) \
        in message
    assert "'model.layers.0.self_attn.o_proj.weight': expected" in message and "float32" in message
    assert len(set(world.allgather(message))) == 1, "ranks raised different errors"
    assert all(not t.any() for t in params.values()), "a parameter was written"


def test_a_model_of_plain_torch_nn_layers_named_like_vllm(world, shared_dir):
    tp, rank = world.size, world.rank
    if rank == 0:
        write_model_dir(shared_dir, checkpoint(7))
    world.barrier()
    c = CONFIG
    h, per_vocab = c["hidden_size"], (c["vocab_size"] + 63) // 64 * 64 // tp
    shards = expected_shards(checkpoint(0), tp, rank)

    def linear(name):
        out, inp = shards[name].shape
        return torch.nn.Linear(inp, out, bias=False, dtype=torch.bfloat16)

    class Layer(torch.nn.Module):
        def __init__(self, p):
            super().__init__()
            self.input_layernorm = torch.nn.Module()
            self.input_layernorm.weight = torch.nn.Parameter(torch.zeros(h, dtype=torch.bfloat16))
            self.post_attention_layernorm = torch.nn.Module()
            self.post_attention_layernorm.weight = torch.nn.Parameter(torch.zeros(h, dtype=torch.bfloat16))
            self.self_attn = torch.nn.Module()
            self.self_attn.qkv_proj = linear(p + "self_attn.qkv_proj.weight")
            self.self_attn.o_proj = linear(p + "self_attn.o_proj.weight")
            self.mlp = torch.nn.Module()
            self.mlp.gate_up_proj = linear(p + "mlp.gate_up_proj.weight")
            self.mlp.down_proj = linear(p + "mlp.down_proj.weight")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.embed_tokens = torch.nn.Embedding(per_vocab, h, dtype=torch.bfloat16)
            self.model.layers = torch.nn.ModuleList(
                [Layer("model.layers.%d." % l) for l in range(c["num_hidden_layers"])])
            self.model.norm = torch.nn.Module()
            self.model.norm.weight = torch.nn.Parameter(torch.zeros(h, dtype=torch.bfloat16))
            self.lm_head = torch.nn.Linear(h, per_vocab, bias=False, dtype=torch.bfloat16)

    model = Model()
    with torch.no_grad():
        params = dict(model.named_parameters())
        r = tpreload.reload_weights(params, shared_dir, world=world)
    assert r.complete
    assert_holds(params, expected_shards(checkpoint(7), tp, rank), "torch.nn model")
    assert model.lm_head.weight.data_ptr() == params["lm_head.weight"].data_ptr()


def test_lora_wrapped_layers_resolve_to_their_base_layer(world, shared_dir):
    tp = world.size
    if world.rank == 0:
        write_model_dir(shared_dir, checkpoint(8))
    world.barrier()
    params = {}
    for name, t in zeros_like_shards(world, tp).items():
        linear = any(m in name for m in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
        params[name.replace(".weight", ".base_layer.weight") if linear else name] = t
    params["model.layers.0.self_attn.qkv_proj.lora_a"] = torch.zeros((8, 64), dtype=torch.bfloat16)  # ignored
    r = tpreload.reload_weights(params, shared_dir, world=world, lora=True)
    assert r.complete
    want = expected_shards(checkpoint(8), tp, world.rank)
    for name, t in want.items():
        got = params.get(name, params.get(name.replace(".weight", ".base_layer.weight")))
        assert torch.equal(got.view(torch.int16), t.view(torch.int16)), name
    assert not params["model.layers.0.self_attn.qkv_proj.lora_a"].any()
