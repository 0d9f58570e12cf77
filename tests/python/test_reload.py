"""tpreload's Python module under mpirun: borrowed tensors reloaded in place,
byte for byte against an independent slicing written in conftest.py."""
import json
import os
import platform
import zlib

import pytest
import torch

import tpreload
from conftest import CONFIG, checkpoint, expected_shards, raw_bytes, write_model_dir


def zeros_like_shards(world, tp):
    """This rank's parameters: zeros with the shapes of its shards."""
    shapes = expected_shards(checkpoint(0), tp, world.rank % tp)
    return {n: torch.zeros(t.shape, dtype=t.dtype) for n, t in shapes.items()}


def config_only(world, shared_dir):
    """The model's config.json in shared_dir (written by rank 0), for weights from an iterator."""
    if world.rank == 0:
        write_model_dir(shared_dir, {})
    world.barrier()
    return os.path.join(shared_dir, "config.json")


def assert_holds(params, want, what):
    for name, t in want.items():
        assert torch.equal(params[name].view(torch.int16), t.view(torch.int16)), "%s: %s differs" % (what, name)


# readers="node" with a node per rank: each rank reads for itself, nothing is sent;
# with rotated broadcast roots the ranks take turns reading for every rank.
@pytest.mark.parametrize("distribution,readers,rotate", [("scatter", "one", False), ("broadcast", "one", False),
                                                         ("scatter", "all", False), ("broadcast", "node", False),
                                                         ("broadcast", "node", True)])
def test_reload_in_place_from_safetensors(world, shared_dir, distribution, readers, rotate):
    tp = world.size
    v1, v2 = checkpoint(1), checkpoint(2)
    if world.rank == 0:
        write_model_dir(os.path.join(shared_dir, "v1"), v1)
        write_model_dir(os.path.join(shared_dir, "v2"), v2)
    world.barrier()
    params = zeros_like_shards(world, tp)
    pointers = {n: t.data_ptr() for n, t in params.items()}
    r = tpreload.reload_weights(params, os.path.join(shared_dir, "v1"), world=world, distribution=distribution,
                                bucket_mb=0.01, readers=readers, ranks_per_node=1, rotate_broadcast_roots=rotate)
    assert r.complete and not r.skipped
    assert_holds(params, expected_shards(v1, tp, world.rank), "v1")
    assert r.fingerprint is None and not r.crc32, "fingerprints are opt-in"
    r = tpreload.reload_weights(params, os.path.join(shared_dir, "v1", "config.json"), world=world,
                                weights_path=os.path.join(shared_dir, "v2"), distribution=distribution,
                                fingerprint=True, readers=readers, ranks_per_node=1,
                                rotate_broadcast_roots=rotate, pipeline_depth=3)
    # (every rank reading into host tensors reads each write straight into its tensor: no pipeline)
    assert r.complete and r.pipeline_depth == (0 if readers == "all" else 3), "the depth run"
    assert_holds(params, expected_shards(v2, tp, world.rank), "v2")
    assert {n: t.data_ptr() for n, t in params.items()} == pointers, "a parameter moved"
    assert r.seconds["total"] > 0 and r.readers == readers and r.rotated_broadcast_roots == rotate
    assert r.nodes_served == 0, "every rank opened the weights"
    sends = readers == "one" or (rotate and world.size > 1)
    assert (r.bytes_transferred > 0) == sends, "every rank reading for itself sends nothing"
    # Every rank's CRC of every parameter, against zlib over the test's own shards of v2.
    want = {n: [zlib.crc32(raw_bytes(expected_shards(v2, tp, q)[n])) for q in range(world.size)]
            for n in params}
    assert r.crc32 == want


def reload_version(world, shared_dir, version, config_name="", **kwargs):
    """Checkpoint `version` written to shared_dir/v<version> (rank 0), reloaded into
    zeros with config naming that directory or, with config_name, a file in it;
    asserts every rank holds its shards."""
    ckpt = checkpoint(version)
    path = os.path.join(shared_dir, "v%d" % version)
    if world.rank == 0:
        write_model_dir(path, ckpt)
    world.barrier()
    params = zeros_like_shards(world, world.size)
    r = tpreload.reload_weights(params, os.path.join(path, config_name), world=world, **kwargs)
    assert r.complete
    assert_holds(params, expected_shards(ckpt, world.size, world.rank), "v%d" % version)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's")
def test_reloads_after_keeping_freed_memory(world, shared_dir):
    # glibc takes the settings, and reloads stay exact after them.
    assert tpreload.retain_freed_memory() is True
    for version in (4, 5):
        reload_version(world, shared_dir, version, bucket_mb=0.01)


def test_the_weights_default_to_the_configs_directory(world, shared_dir):
    # No weights_path: the checkpoint beside config.json, whether config names
    # the file or its directory.
    reload_version(world, shared_dir, 6)
    reload_version(world, shared_dir, 7, "config.json")


def test_reload_from_hdf5(world, shared_dir):
    import h5py  # (scripts/setup.sh installs python3-h5py)
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
    config = config_only(world, shared_dir)
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


def test_a_generator_is_taken_as_the_reload_goes(world, shared_dir):
    """With readers="one" the reader takes the iterator a segment at a time (4 x
    bucket x depth bytes: here 4 x 1048 bytes, and a tensor may cross it) and
    drops each tensor once sent: a generator of gathered temporaries never has
    more than a segment alive. An exception it raises is the same error on
    every rank."""
    import weakref
    tp = world.size
    config = config_only(world, shared_dir)
    ckpt = checkpoint(11)

    def nbytes(t):
        return t.numel() * t.element_size()
    alive, most = [], [0]

    def gathered():
        for name, t in ckpt.items():
            most[0] = max(most[0], sum(n for r, n in alive if r() is not None))
            temporary = t.clone()
            alive.append((weakref.ref(temporary), nbytes(temporary)))
            yield name, temporary

    params = zeros_like_shards(world, tp)
    it = gathered() if world.rank == 0 else None
    r = tpreload.reload_weights(params, config, world=world, weights_iterator=it, bucket_mb=0.001,
                                pipeline_depth=1)
    assert r.complete
    assert "segments" in r.source, r.source
    assert_holds(params, expected_shards(ckpt, tp, world.rank), "lazy generator")
    if world.rank == 0:
        total = sum(nbytes(t) for t in ckpt.values())
        segment = 4 * int(0.001 * 1048576) + max(nbytes(t) for t in ckpt.values())
        assert len(alive) == len(ckpt)
        assert most[0] <= segment < total / 2, "%d of %d bytes alive at once" % (most[0], total)
        assert all(r() is None for r, _ in alive), "the reload kept tensors of the iterator"

    def failing():
        for i, item in enumerate(ckpt.items()):
            if i == 3:
                raise RuntimeError("the trainer lost its shard")
            yield item

    with pytest.raises(tpreload.CheckpointError) as error:
        tpreload.reload_weights(params, config, world=world, weights_iterator=failing() if world.rank == 0 else None,
                                bucket_mb=0.001, pipeline_depth=1)
    assert error.value.agreed
    assert "RuntimeError: the trainer lost its shard" in str(error.value), str(error.value)
    messages = world.allgather(str(error.value))
    assert len(set(messages)) == 1, messages
    # require_complete without atomic refuses before any write: the iterator is read whole first.
    r = tpreload.reload_weights(params, config, world=world, require_complete=True,
                                weights_iterator=iter(ckpt.items()) if world.rank == 0 else None)
    assert r.complete and "segments" not in r.source, r.source


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
    pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
    with torch.no_grad():
        r = tpreload.reload_weights(dict(model.named_parameters()), shared_dir, world=world)
    assert r.complete
    assert_holds(dict(model.named_parameters()), expected_shards(checkpoint(7), tp, rank), "torch.nn model")
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == pointers, "the module's storage changed"


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


def test_a_generator_of_temporary_and_non_contiguous_tensors(world, shared_dir):
    """vLLM's iterators yield tensors they drop at the next step, and transposed
    or expanded views: each must be read as the values it shows."""
    tp = world.size
    if world.rank == 0:
        write_model_dir(shared_dir, {})
    world.barrier()
    ckpt = checkpoint(9)

    def generate():
        for name, t in ckpt.items():
            if t.dim() == 2:
                yield name, t.t().clone().t()  # a fresh temporary, column-major
            elif name != "model.norm.weight":
                yield name, t.clone()
        # a stride-0 view of a 1-element tensor for the norm: every element the same
        yield "model.norm.weight", torch.full((1,), 0.5, dtype=torch.bfloat16).expand(CONFIG["hidden_size"])

    params = zeros_like_shards(world, tp)
    it = generate() if world.rank == 0 else None
    assert tpreload.reload_weights(params, shared_dir, world=world, weights_iterator=it).complete
    want = dict(ckpt)
    want["model.norm.weight"] = torch.full((CONFIG["hidden_size"],), 0.5, dtype=torch.bfloat16)
    assert_holds(params, expected_shards(want, tp, world.rank), "generator")


def test_a_problem_on_one_rank_is_the_same_error_on_every_rank(world, shared_dir):
    tp = world.size
    last = world.size - 1
    if world.rank == 0:
        write_model_dir(shared_dir, checkpoint(10))
    world.barrier()

    def raised(**kwargs):
        params = kwargs.pop("params", None) or zeros_like_shards(world, tp)
        config = kwargs.pop("config", shared_dir)
        with pytest.raises(tpreload.Error) as error:
            tpreload.reload_weights(params, config, world=world, **kwargs)
        assert error.value.agreed, "an error before the transfer must be agreed"
        assert all(not t.any() for t in params.values()), "a parameter was written"
        messages = world.allgather("%s: %s" % (type(error.value).__name__, error.value))
        assert len(set(messages)) == 1, "ranks raised different errors: %s" % messages
        return error.value

    # The config is missing on the last rank only.
    e = raised(config=shared_dir if world.rank != last else os.path.join(shared_dir, "nowhere"))
    assert isinstance(e, tpreload.ModelError) and "rank %d/%d" % (last, world.size) in str(e)
    # A weights path that only the reader opens does not exist.
    e = raised(weights_path=os.path.join(shared_dir, "missing.safetensors"))
    assert isinstance(e, tpreload.CheckpointError) and "missing.safetensors" in str(e)
    # Only the reader is given both a path and an iterator.
    e = raised(weights_path=shared_dir, weights_iterator=[] if world.rank == 0 else None)
    assert isinstance(e, tpreload.UsageError) and "not both" in str(e)
    # A tp size that is not a size.
    e = raised(tp_size=-tp)
    assert isinstance(e, tpreload.UsageError) and "tp_size must be positive, got %d" % -tp in str(e)
    # The reader's iterator yields something that is not a pair (found as the
    # reload takes it).
    e = raised(weights_iterator=[("x",)] if world.rank == 0 else None)
    assert isinstance(e, tpreload.CheckpointError) and "rank 0/" in str(e), str(e)
    assert "weights_iterator: ValueError: not enough values to unpack" in str(e), str(e)
    # The last rank's parameter has the wrong shape.
    params = zeros_like_shards(world, tp)
    if world.rank == last:
        params["model.norm.weight"] = torch.zeros(3, dtype=torch.bfloat16)
    e = raised(params=params)
    assert isinstance(e, tpreload.ValidationError)
    assert "'model.norm.weight': expected [64] bfloat16, got [3] bfloat16" in str(e)
    # A parameter of a dtype tpreload does not know.
    params = zeros_like_shards(world, tp)
    params["model.norm.weight"] = torch.zeros(64, dtype=torch.int16)
    e = raised(params=params)
    assert "'model.norm.weight': expected [64] bfloat16, got [64] int16" in str(e)
    # Fingerprints asked for on some ranks only (gathering them is collective).
    if world.size > 1:
        e = raised(fingerprint=world.rank == 0)
        assert isinstance(e, tpreload.UsageError) and "ranks disagree on fingerprint" in str(e)
    # A data plane asked for on some ranks only (the text is the same everywhere).
    if world.size > 1:
        e = raised(transport="nccl" if world.rank == 0 else "mpi")
        assert isinstance(e, tpreload.UsageError) and "ranks disagree on the data plane's transport" in str(e)
    # Options that change the collectives, set differently on the reader, reach
    # the engine's agreement.
    if world.size > 1:
        for option, part, default in (("zero_copy", "zero-copy", False),
                                      ("compare_replicas", "compare-replicas", True)):
            e = raised(**{option: (not default) if world.rank == 0 else default})
            assert isinstance(e, tpreload.UsageError) and "ranks disagree on %s" % part in str(e), str(e)
    # Nonsense options.
    for seconds in (0, 0.5, float("nan"), 1e9):
        e = raised(read_timeout_s=seconds)
        assert isinstance(e, tpreload.UsageError) and "read_timeout_s must be in [1, " in str(e), str(e)
    assert isinstance(raised(bucket_mb=float("inf")), tpreload.UsageError)
    assert isinstance(raised(distribution="gossip"), tpreload.UsageError)


def test_a_problem_whose_message_cannot_be_printed_is_still_agreed(world, shared_dir):
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no message")

    class Params(dict):
        def items(self):
            raise Unprintable()

    class NotUtf8(dict):
        def items(self):
            raise ValueError("no file '/m/v\udcff'")  # (a name decoded with surrogateescape)

    params = zeros_like_shards(world, world.size)
    for broken, text in ((Params, "Unprintable (its message could not be printed)"),
                         (NotUtf8, "ValueError: no file '/m/v\\udcff'")):
        mine = broken(params) if world.rank == world.size - 1 else params
        with pytest.raises(tpreload.UsageError) as error:
            tpreload.reload_weights(mine, shared_dir, world=world)
        assert error.value.agreed
        assert text in str(error.value)
        messages = world.allgather(str(error.value))
        assert len(set(messages)) == 1, "ranks raised different errors: %s" % messages


def test_entries_that_are_not_parameters_are_ignored_whatever_they_are(world, shared_dir):
    tp = world.size
    if world.rank == 0:
        write_model_dir(shared_dir, checkpoint(11))
    world.barrier()
    params = zeros_like_shards(world, tp)
    params["model.rotary_emb.inv_freq"] = torch.zeros(4, dtype=torch.complex64)
    params["model.layers.0.self_attn.attn.k_scale"] = torch.zeros(1, dtype=torch.int16)
    params["model.layers.0.mlp.experts.meta_placeholder"] = torch.empty(8, device="meta")
    params["model.layers.0.mlp.gate.weight_t"] = torch.zeros(4, 8).t()  # not contiguous
    r = tpreload.reload_weights(params, shared_dir, world=world)
    assert r.complete
    assert_holds(params, expected_shards(checkpoint(11), tp, world.rank), "with extra entries")


def test_replicas_of_a_smaller_tensor_parallel_group(world, shared_dir):
    if world.size < 2:
        pytest.skip("replicas need two ranks")
    tp = world.size // 2
    if world.rank == 0:
        write_model_dir(shared_dir, checkpoint(12))
    world.barrier()
    params = {n: torch.zeros_like(t) for n, t in expected_shards(checkpoint(0), tp, world.rank % tp).items()}
    r = tpreload.reload_weights(params, shared_dir, world=world, tp_size=tp, fingerprint=True)
    assert r.complete
    assert_holds(params, expected_shards(checkpoint(12), tp, world.rank % tp), "replica")
    for name, crcs in r.crc32.items():
        assert crcs[:tp] == crcs[tp:2 * tp], "replicas differ on %s" % name


def test_fingerprints_need_the_same_names_on_every_rank(world, shared_dir):
    if world.size < 2:
        pytest.skip("needs two ranks")
    tp = world.size
    if world.rank == 0:
        write_model_dir(shared_dir, checkpoint(13))
    world.barrier()
    params = zeros_like_shards(world, tp)
    if world.rank == 1:  # this rank's model wraps o_proj in a LoRA layer
        for l in range(CONFIG["num_hidden_layers"]):
            name = "model.layers.%d.self_attn.o_proj.weight" % l
            params[name.replace(".weight", ".base_layer.weight")] = params.pop(name)
    with pytest.raises(tpreload.UsageError) as error:
        tpreload.reload_weights(params, shared_dir, world=world, lora=True, fingerprint=True)
    assert error.value.agreed and "differently named parameters" in str(error.value)
    assert_holds({n.replace(".base_layer", ""): t for n, t in params.items()},
                 expected_shards(checkpoint(13), tp, world.rank), "reloaded before the fingerprints")


def test_atomic_and_require_complete(world, shared_dir):
    tp = world.size
    full, lacking = checkpoint(14), dict(checkpoint(15))
    del lacking["model.layers.0.mlp.down_proj.weight"]
    if world.rank == 0:
        write_model_dir(os.path.join(shared_dir, "full"), full)
        write_model_dir(os.path.join(shared_dir, "lacking"), lacking)
    world.barrier()
    params = zeros_like_shards(world, tp)
    r = tpreload.reload_weights(params, os.path.join(shared_dir, "full"), world=world, atomic=True)
    assert r.complete and r.atomic
    assert_holds(params, expected_shards(full, tp, world.rank), "atomic")
    with pytest.raises(tpreload.ValidationError) as error:
        tpreload.reload_weights(params, os.path.join(shared_dir, "lacking"), world=world, require_complete=True)
    assert error.value.agreed and "model.layers.0.mlp.down_proj.weight" in str(error.value)
    assert_holds(params, expected_shards(full, tp, world.rank), "after the refused reload")


def test_checksums_can_be_turned_off_and_cost_nothing_then(world, shared_dir):
    tp = world.size
    ckpt = checkpoint(16)
    if world.rank == 0:
        write_model_dir(os.path.join(shared_dir, "m"), ckpt)
    world.barrier()
    for checksums in (True, False):
        params = zeros_like_shards(world, tp)
        r = tpreload.reload_weights(params, os.path.join(shared_dir, "m"), world=world, checksums=checksums,
                                    bucket_mb=0.01)
        assert r.complete
        assert_holds(params, expected_shards(ckpt, tp, world.rank), "checksums=%s" % checksums)
        if not checksums:
            assert r.seconds["checksum"] == 0


def test_zero_copy_broadcasts_from_the_mapping_with_the_same_bytes(world, shared_dir):
    tp = world.size
    ckpt = checkpoint(17)
    if world.rank == 0:
        write_model_dir(os.path.join(shared_dir, "m"), ckpt)
    world.barrier()
    copied = {}
    for zero_copy in (False, True):
        params = zeros_like_shards(world, tp)
        r = tpreload.reload_weights(params, os.path.join(shared_dir, "m"), world=world, distribution="broadcast",
                                    zero_copy=zero_copy, read_timeout_s=5, bucket_mb=0.01)
        assert r.complete
        assert_holds(params, expected_shards(ckpt, tp, world.rank), "zero_copy=%s" % zero_copy)
        copied[zero_copy] = r.bytes_copied_on_reader
    # Without it the reader copies every byte into its send buffers; with it the
    # buckets that are one run of the file are sent from the mapping.
    assert copied[False] >= sum(t.numel() * t.element_size() for t in ckpt.values()), copied
    assert copied[True] < copied[False] / 2, copied


def test_the_world_keeps_the_timeout_it_was_made_with(world):
    assert world.timeout_s == 300  # (the default the docstring gives)
    assert tpreload.World().timeout_s == world.timeout_s
    assert tpreload.World(timeout_s=300).timeout_s == 300
    with pytest.raises(tpreload.UsageError) as error:
        tpreload.World(timeout_s=60)
    assert "timeout_s=300" in str(error.value) and "timeout_s=60" in str(error.value)


def test_a_workspace_released_in_another_thread_waits_for_the_reload_using_it(world, shared_dir):
    # While rank 0 is slow to hand over its weights, the other ranks' reloads run
    # (waiting in a collective) with the workspace's buffers and plan: a release
    # from another thread must wait for the reload to end, not free them under it.
    import threading
    import time
    if world.size == 1:
        pytest.skip("the reload waits in a collective only for a peer")
    tp = world.size
    config = config_only(world, shared_dir)
    ckpt = checkpoint(6)

    def slowly():
        for item in ckpt.items():
            time.sleep(0.6 / len(ckpt))
            yield item

    params = zeros_like_shards(world, tp)
    ws = tpreload.Workspace()
    done = {}

    def run():
        it = slowly() if world.rank == 0 else None
        done["result"] = tpreload.reload_weights(params, config, world=world, weights_iterator=it,
                                                 workspace=ws, bucket_mb=0.01)

    thread = threading.Thread(target=run)
    started = time.monotonic()
    thread.start()
    time.sleep(0.2)
    ws.release()
    waited = time.monotonic() - started
    thread.join()
    assert done["result"].complete
    assert_holds(params, expected_shards(ckpt, tp, world.rank), "released during the reload")
    # The other ranks' reloads cannot end before rank 0 has read its iterator
    # (0.6 s), so a release that waited for them returns after that. (Rank 0
    # itself is still reading its iterator, outside the reload's lock.)
    if world.rank != 0:
        assert waited >= 0.45, "released after %.2f s, while a reload used it" % waited


def e4m3_codes(x):
    """float32 values (already scaled) to float8_e4m3fn codes: clamped to +-448, the
    nearest value of the format's table, ties to the even code (written for the tests)."""
    table = torch.tensor([(c & 7) / 8.0 * 2.0 ** -6 if c >> 3 == 0 else (1 + (c & 7) / 8.0) * 2.0 ** ((c >> 3) - 7)
                          for c in range(127)], dtype=torch.float64)
    x = x.double().clamp(-448, 448)
    a = x.abs()
    hi = torch.searchsorted(table, a).clamp(max=126)
    lo = (hi - 1).clamp(min=0)
    below, above = a - table[lo], table[hi] - a
    take_lo = (below < above) | ((below == above) & (lo % 2 == 0))
    code = torch.where(table[hi] == a, hi, torch.where(take_lo, lo, hi))
    return (code | torch.where(x < 0, 128, 0)).to(torch.uint8)


def online_fp8_case(world, shared_dir, seed):
    """The config, a checkpoint, the rank's bfloat16 shards, the names of its linear
    weights and parameters for them: FP8 weights as uint8 (a torch without float8)."""
    config = config_only(world, shared_dir)
    ckpt = checkpoint(seed)
    bf16 = expected_shards(ckpt, world.size, world.rank)
    linear = [n for n in bf16 if n.endswith("proj.weight") and ".layers." in n]
    assert linear, "the model has linear layers"
    params = {n: torch.zeros(t.shape, dtype=torch.uint8 if n in linear else t.dtype) for n, t in bf16.items()}
    return config, ckpt, bf16, linear, params


def test_online_fp8_quantizes_each_linear_with_one_scale(world, shared_dir):
    """quantization="fp8": the linear weights are float8_e4m3fn (held as uint8 by a torch
    without float8) with a float32 weight_scale [1] each: amax / 448 over the rank's fused
    weight, every value times 1 / scale, rounded to the nearest code."""
    config, ckpt, bf16, linear, params = online_fp8_case(world, shared_dir, 7)
    params.update({n + "_scale": torch.zeros(1, dtype=torch.float32) for n in linear})
    it = list(ckpt.items()) if world.rank == 0 else None
    r = tpreload.reload_weights(params, config, world=world, weights_iterator=it, quantization="fp8", bucket_mb=0.01)
    assert r.complete
    for n in linear:
        w = bf16[n].float()
        scale = w.abs().max() / 448
        assert torch.equal(params[n + "_scale"], scale.reshape(1)), n + "_scale"
        assert torch.equal(params[n], e4m3_codes(w * (1 / scale))), n
    others = {n: t for n, t in bf16.items() if n not in linear}
    assert_holds({n: params[n] for n in others}, others, "unquantized")


def test_online_fp8_block_quantizes_each_linear_in_blocks(world, shared_dir):
    """quantization="fp8-block": the linear weights are float8_e4m3fn with a float32
    weight_scale_inv grid [ceil(N / 128), ceil(K / 128)] each: the rank's fused weight
    zero-padded to whole 128 x 128 blocks, each block's amax (at least 1e-4) times the
    float 1/448, every value times the reciprocal of its block's scale, nearest code."""
    config, ckpt, bf16, linear, params = online_fp8_case(world, shared_dir, 9)

    def blocks(t):
        return [-(-d // 128) for d in t.shape]

    params.update({n + "_scale_inv": torch.zeros(blocks(bf16[n]), dtype=torch.float32) for n in linear})
    it = list(ckpt.items()) if world.rank == 0 else None
    r = tpreload.reload_weights(params, config, world=world, weights_iterator=it, quantization="fp8-block",
                                bucket_mb=0.01)
    assert r.complete
    for n in linear:
        w = bf16[n].float()
        (m, k), (bm, bk) = w.shape, blocks(w)
        padded = torch.zeros(bm * 128, bk * 128)
        padded[:m, :k] = w
        view = padded.view(bm, 128, bk, 128)
        scale = view.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-4) * (1 / 448)
        scaled = (view * scale.reciprocal()).view(bm * 128, bk * 128)[:m, :k]
        assert torch.equal(params[n + "_scale_inv"], scale.view(bm, bk)), n + "_scale_inv"
        assert torch.equal(params[n], e4m3_codes(scaled)), n
    others = {n: t for n, t in bf16.items() if n not in linear}
    assert_holds({n: params[n] for n in others}, others, "unquantized")


def row_slice(tensor, rank, ranks):
    """Rows of ``tensor`` that rank ``rank`` of ``ranks`` holds (the first
    rows % ranks ranks one row more), and their first row."""
    rows = tensor.shape[0]
    base, extra = divmod(rows, ranks)
    first = rank * base + min(rank, extra)
    return tensor[first:first + base + (1 if rank < extra else 0)], first


@pytest.mark.parametrize("holding", ["rows", "whole_on_last"])
def test_shards_held_by_every_rank_reload_in_place(world, shared_dir, holding):
    tp = world.size
    config = config_only(world, shared_dir)
    v2 = checkpoint(2)
    shards = []
    for name, t in v2.items():
        if holding == "rows":  # each rank a row slice of every tensor (FSDP)
            part, first = row_slice(t, world.rank, world.size)
            if part.shape[0]:
                shards.append((name, part, t.shape, [first] + [0] * (t.dim() - 1)))
        elif world.rank == world.size - 1:  # one rank holds everything, whole
            shards.append((name, t, t.shape, [0] * t.dim()))
    params = zeros_like_shards(world, tp)
    pointers = {n: t.data_ptr() for n, t in params.items()}
    r = tpreload.reload_weights(params, config, world=world, shards=shards, bucket_mb=0.01)
    assert r.complete and not r.skipped
    assert_holds(params, expected_shards(v2, tp, world.rank), holding)
    assert {n: t.data_ptr() for n, t in params.items()} == pointers, "a parameter moved"
    assert r.source.startswith("sharded sources"), r.source


def test_ranks_that_serve_nothing_send_their_shards(world, shared_dir):
    """serving_ranks: the first half of the world serves (no shards); the rest
    hold row slices, pass no parameters and only send."""
    if world.size < 2:
        pytest.skip("a trainer rank beside a serving one needs two ranks")
    serving = world.size // 2
    trainers = world.size - serving
    config = config_only(world, shared_dir)
    v2 = checkpoint(12)
    shards, params = [], {}
    if world.rank < serving:
        params = zeros_like_shards(world, serving)
    else:
        for name, t in v2.items():
            part, first = row_slice(t, world.rank - serving, trainers)
            if part.shape[0]:
                shards.append((name, part, t.shape, [first] + [0] * (t.dim() - 1)))
    r = tpreload.reload_weights(params, config, world=world, shards=shards, serving_ranks=serving,
                                bucket_mb=0.01)
    assert r.complete, r.source
    assert "into the %d serving ranks" % serving in r.source, r.source
    if world.rank < serving:
        assert_holds(params, expected_shards(v2, serving, world.rank), "served")
    else:
        assert not r.loaded


DEEPSEEK = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "first_k_dense_replace": 1, "num_attention_heads": 4,
            "num_key_value_heads": 4, "moe_intermediate_size": 32, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
            "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 8, "vocab_size": 100, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_derived_views_with_serving_ranks(world, shared_dir):
    """A bfloat16 DeepSeek served as vLLM holds it: W_UK_T and W_UV are views of
    kv_b_proj, not parameters (derived_views=True). The trainer ranks, which hold
    no parameters, take the same layout; kv_b_proj is written, its views with it."""
    c = DEEPSEEK
    serving = world.size // 2
    if world.size < 2 or c["num_attention_heads"] % serving:
        pytest.skip("a trainer rank beside a serving one, and heads split by the serving ranks")
    tp, r = serving, world.rank % serving
    h, inter, heads, q_lora, kv_lora = (c[k] for k in ("hidden_size", "intermediate_size",
                                                       "num_attention_heads", "q_lora_rank", "kv_lora_rank"))
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    padded = (c["vocab_size"] + 63) // 64 * 64
    a = "model.layers.0.self_attn."
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "lm_head.weight": (c["vocab_size"], h),
              "model.norm.weight": (h,), "model.layers.0.input_layernorm.weight": (h,),
              "model.layers.0.post_attention_layernorm.weight": (h,), a + "q_a_proj.weight": (q_lora, h),
              a + "q_a_layernorm.weight": (q_lora,), a + "q_b_proj.weight": (heads * (nope + rope), q_lora),
              a + "kv_a_proj_with_mqa.weight": (kv_lora + rope, h), a + "kv_a_layernorm.weight": (kv_lora,),
              a + "kv_b_proj.weight": (heads * (nope + vd), kv_lora), a + "o_proj.weight": (h, heads * vd),
              "model.layers.0.mlp.gate_proj.weight": (inter, h), "model.layers.0.mlp.up_proj.weight": (inter, h),
              "model.layers.0.mlp.down_proj.weight": (h, inter)}
    gen = torch.Generator().manual_seed(31)
    ckpt = {n: (torch.randn(s, generator=gen) * 0.1).to(torch.bfloat16) for n, s in sorted(shapes.items())}
    if world.rank == 0:
        with open(os.path.join(shared_dir, "config.json"), "w") as f:
            json.dump(c, f)
    world.barrier()
    local = heads // tp
    kv_b_rows = local * (nope + vd)
    shards, params = [], {}
    if world.rank < serving:  # this rank's shard shapes, as vLLM's DeepSeek holds them
        params = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in {
            "model.embed_tokens.weight": (padded // tp, h), "lm_head.weight": (padded // tp, h),
            "model.norm.weight": (h,), "model.layers.0.input_layernorm.weight": (h,),
            "model.layers.0.post_attention_layernorm.weight": (h,),
            a + "fused_qkv_a_proj.weight": (q_lora + kv_lora + rope, h), a + "q_a_layernorm.weight": (q_lora,),
            a + "q_b_proj.weight": (local * (nope + rope), q_lora), a + "kv_a_layernorm.weight": (kv_lora,),
            a + "kv_b_proj.weight": (kv_b_rows, kv_lora), a + "o_proj.weight": (h, local * vd),
            "model.layers.0.mlp.gate_up_proj.weight": (2 * inter // tp, h),
            "model.layers.0.mlp.down_proj.weight": (h, inter // tp)}.items()}
    else:
        for name, t in ckpt.items():
            part, first = row_slice(t, world.rank - serving, world.size - serving)
            if part.shape[0]:
                shards.append((name, part, t.shape, [first] + [0] * (t.dim() - 1)))
    r_ = tpreload.reload_weights(params, os.path.join(shared_dir, "config.json"), world=world, shards=shards,
                                 serving_ranks=serving, derived_views=True, bucket_mb=0.01)
    assert r_.complete, r_.source
    if world.rank >= serving:
        return
    want = {a + "kv_b_proj.weight": ckpt[a + "kv_b_proj.weight"][r * kv_b_rows:(r + 1) * kv_b_rows],
            a + "o_proj.weight": ckpt[a + "o_proj.weight"][:, r * local * vd:(r + 1) * local * vd].contiguous(),
            a + "fused_qkv_a_proj.weight": torch.cat([ckpt[a + "q_a_proj.weight"],
                                                      ckpt[a + "kv_a_proj_with_mqa.weight"]])}
    assert_holds(params, want, "derived_views (kv_b_proj: W_UK_T's and W_UV's base)")


def test_shards_missing_a_range_are_refused_on_every_rank(world, shared_dir):
    config = config_only(world, shared_dir)
    v2 = checkpoint(2)
    name = "model.layers.0.mlp.down_proj.weight"
    shards = []
    for n, t in v2.items():
        part, first = row_slice(t, world.rank, world.size)
        if n == name and world.rank == world.size - 1:
            part = part[:-1]  # the last row of the tensor: held by none
        if part.shape[0]:
            shards.append((n, part, t.shape, [first] + [0] * (t.dim() - 1)))
    params = zeros_like_shards(world, world.size)
    with pytest.raises(tpreload.ValidationError) as e:
        tpreload.reload_weights(params, config, world=world, shards=shards)
    assert e.value.agreed
    rows = v2[name].shape[0]
    assert "'%s'" % name in str(e.value) and "[%d:%d, " % (rows - 1, rows) in str(e.value), str(e.value)
    assert all(not t.any() for t in params.values()), "nothing is written"
    with pytest.raises(tpreload.UsageError):
        tpreload.reload_weights(params, config, world=world, shards=shards, weights_path=config)
