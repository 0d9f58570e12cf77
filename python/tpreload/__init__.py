"""Reload a live tensor-parallel model's parameters in place, from Python, under mpirun.

Every rank calls :func:`reload_weights` with its own parameters (for example
``dict(model.named_parameters())`` of a vLLM worker): the reader rank reads the
checkpoint (or takes tensors handed over in memory), the bytes travel over MPI
(or NCCL for CUDA parameters), and each rank's tensors are overwritten in place:
their storage, shapes, strides and dtypes never change.

The module does not link against PyTorch: it reads each tensor's data pointer,
shape, strides, dtype and device through the tensor's own attributes, so one
build works with whatever PyTorch the process imported.
"""

import atexit as _atexit
import os as _os
import sys as _sys
import threading as _threading

from . import _tpreload
from ._tpreload import (  # noqa: F401  (re-exported)
    CheckpointError,
    CommError,
    CommTimeoutError,
    Error,
    ModelError,
    UsageError,
    ValidationError,
    Workspace,
)

__all__ = [
    "World", "Workspace", "ReloadResult", "reload_weights", "Error", "CheckpointError", "CommError",
    "CommTimeoutError", "ModelError", "UsageError", "ValidationError", "retain_freed_memory",
    "built_with_cuda",
]

_default_world = None


class World:
    """The MPI world of this process. MPI is initialised here when the process has
    not done it, and finalized at exit; one World per process is enough.

    A failure that only this rank saw (an error whose ``agreed`` is False, or any
    exception that ends the program) may leave its peers waiting in a collective:
    then the exit ends the whole MPI job (MPI_Abort) instead of finalizing, as
    the C++ programs do. So does a tpreload error whose ``agreed`` is False that
    ends another thread (a reload thread of a serving engine).

    timeout_s: the longest any collective may take on this rank (seconds, default
    300) before it fails with CommTimeoutError and the job is ended. Set by the
    process's first World; a later one asking for another raises UsageError."""

    def __init__(self, timeout_s=None):
        global _default_world
        if _default_world is not None:
            self._native = _default_world._native
            if timeout_s is not None and float(timeout_s) != self._native.timeout_s:
                raise UsageError("this process's World has timeout_s=%g; a World with timeout_s=%g "
                                 "cannot be made beside it" % (self._native.timeout_s, float(timeout_s)))
        else:
            self._native = _tpreload.World(float(300 if timeout_s is None else timeout_s))
            _default_world = self
            _atexit.register(self._native.finalize)
            native, previous = self._native, _sys.excepthook

            def excepthook(kind, value, traceback):
                if not getattr(value, "agreed", False):
                    native.poison()
                previous(kind, value, traceback)

            _sys.excepthook = excepthook
            previous_thread_hook = _threading.excepthook

            def thread_excepthook(args):
                # (an exception that ends another thread leaves the program
                # running: only tpreload's own errors tell of a collective left)
                if isinstance(args.exc_value, Error) and not getattr(args.exc_value, "agreed", False):
                    native.poison()
                previous_thread_hook(args)

            _threading.excepthook = thread_excepthook

    @property
    def rank(self):
        return self._native.rank

    @property
    def timeout_s(self):
        return self._native.timeout_s

    @property
    def size(self):
        return self._native.size

    def barrier(self):
        self._native.barrier()

    def allgather(self, text):
        """Every rank's string, in rank order (collective)."""
        return self._native.allgather(text)

    def set_log_level(self, level):
        """trace, debug, info, warn (the default), error or off."""
        _tpreload.set_log_level(self._native, level)


class ReloadResult:
    """What a reload did, the same on every rank.

    ``complete``: every expected parameter loaded on every rank.
    ``not_loaded_on_all_ranks``: expected names no rank loaded.
    ``not_loaded_on_some_ranks``: name -> ranks that did not load it.
    ``skipped``: source tensors that have no parameter.
    ``seconds``: total, read, transfer, apply, finish, validate (max over ranks).
    ``bytes_transferred``, ``bytes_read``, ``buckets``, ``staging`` (bytes per memory space).
    ``bytes_copied_on_reader``: bytes the reader read or copied into send buffers
    (what ``zero_copy=True`` saves where a bucket is one run of the file).
    ``readers``: "one", "node" or "all" (who read the weights).
    ``rotated_broadcast_roots``: the node readers took turns at the broadcast
    buckets (``rotate_broadcast_roots=True``).
    ``pipeline_depth``: buckets in flight on this rank (chosen per rank when the
    option was 0, so it may differ between ranks); 0 where no pipeline ran
    (readers="all" into host memory reads each write straight into its
    parameter).
    ``nodes_served``: with readers="node", nodes that could not open the
    weights, served by another node's reader.
    ``fingerprint``: one hex string for the whole model across ranks (with
    ``fingerprint=True``, else None).
    ``crc32``: parameter name -> CRC-32 per world rank (with ``fingerprint=True``).
    """

    def __init__(self, fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return ("ReloadResult(complete=%s, loaded=%d, seconds=%.3f, bytes_transferred=%d, fingerprint=%s)"
                % (self.complete, len(self.loaded), self.seconds["total"], self.bytes_transferred,
                   self.fingerprint))


def _device_of(tensor):
    """"cpu", "cuda:N", or the device as torch names it (refused for parameters only)."""
    device = tensor.device
    if device.type == "cuda":
        return "cuda:%d" % (device.index if device.index is not None else _current_cuda_device())
    return str(device)


def _current_cuda_device():
    import torch  # the caller holds CUDA tensors, so torch is there
    return torch.cuda.current_device()


def _synchronize_cuda(tensors):
    """Waits for the kernels queued on every CUDA device of ``tensors``: the reload
    writes on its own stream, which does not wait for torch's."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    if devices:
        import torch
        for device in devices:
            torch.cuda.synchronize(device)


def _item(item, checkpoint_format):
    """(descriptor, tensor) of one weights_iterator item, the tensor made
    contiguous (a transposed or expanded tensor is copied)."""
    if checkpoint_format:
        name, tensor = item
        extra = ()
    else:
        name, tensor, tp_rank = item
        extra = (int(tp_rank),)
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return _describe(name, tensor, *extra), tensor


def _iterator_descriptors(weights_iterator, checkpoint_format, held):
    """Descriptors of the iterator's tensors. Each tensor is appended to
    ``held``, which keeps it alive while the reload reads it: a generator drops
    what it yielded."""
    out = []
    for item in weights_iterator:
        descriptor, tensor = _item(item, checkpoint_format)
        held.append(tensor)
        out.append(descriptor)
    return out


def _stream(weights_iterator, checkpoint_format):
    """The reader's weights_iterator as the native reload takes it, one tensor
    per call: _item()'s (descriptor, tensor) (the reload keeps the tensor alive
    until it has sent it), or None at the end."""
    items = iter(weights_iterator)
    done = object()

    def next_tensor():
        item = next(items, done)
        return None if item is done else _item(item, checkpoint_format)

    return next_tensor


def _describe(name, tensor, *extra):
    dtype = str(tensor.dtype)
    dtype = dtype[len("torch."):] if dtype.startswith("torch.") else dtype
    return (name, int(tensor.data_ptr()), tuple(int(s) for s in tensor.shape),
            tuple(int(s) for s in tensor.stride()), dtype, _device_of(tensor)) + tuple(extra)


def _shard_descriptors(shards, held):
    """Descriptors of the boxes this rank holds: (name, tensor, full_shape,
    offsets), each tensor made contiguous and kept alive in ``held``."""
    out = []
    for item in shards:
        name, tensor, full_shape, offsets = item
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        held.append(tensor)
        full_shape = tuple(int(s) for s in full_shape)
        offsets = tuple(int(o) for o in offsets)
        if len(full_shape) != tensor.dim() or len(offsets) != tensor.dim():
            raise UsageError("shards: '%s' is a %d-d box of a tensor of shape %s at offsets %s"
                             % (name, tensor.dim(), list(full_shape), list(offsets)))
        out.append(_describe(name, tensor) + (full_shape, offsets))
    return out


def reload_weights(params, config, *, world=None, tp_size=None, weights_path=None, weights_iterator=None,
                   shards=None, is_checkpoint_format=True, quantization=None, lora=False, expert_parallel=False,
                   derived_views=False,
                   distribution="scatter", bucket_mb=8, pipeline_depth=0, reader_rank=0,
                   readers="one", ranks_per_node=0, rotate_broadcast_roots=False, transport="mpi", workspace=None,
                   fingerprint=False, atomic=False, require_complete=False, checksums=True,
                   zero_copy=False, compare_replicas=True, read_timeout_s=300, serving_ranks=0):
    """Reload ``params`` in place. COLLECTIVE: every rank of ``world`` calls it with the
    same arguments, except ``params`` (its own) and ``weights_iterator`` (reader rank only,
    or every rank with ``readers="node"`` or ``"all"``).

    params: this rank's parameters, a dict (or iterable of pairs) name -> tensor,
        named as vLLM names them ("model.layers.0.self_attn.qkv_proj.weight", with
        ".base_layer." when ``lora``). Every parameter the model needs on this rank
        must be there with exactly the shape and dtype of its shard, contiguous,
        all on one device (cpu or one cuda device); others are ignored. Otherwise
        every rank raises the same ValidationError, listing every problem, before
        any write.
    config: the model's config.json (or its directory).
    tp_size: tensor-parallel size (default: the world size; the world is replicas x tp).
    weights_path: checkpoint to read on the reader rank: safetensors (one file or
        sharded), HDF5, or a kernel-format directory. Default: the config's directory.
    weights_iterator: on the reader rank instead of a path, tensors in memory:
        (name, tensor) pairs in checkpoint format (Hugging Face names, full
        tensors), or (name, tensor, tp_rank) triples in kernel format (each rank's
        parameters in the serving layout). CPU tensors (made contiguous where
        they are not). With readers="one" it is taken as the reload goes, a
        segment of about 4 x bucket_mb x pipeline_depth at a time: each tensor is
        kept only until it has been sent, so a generator that yields gathered
        temporaries never holds the model; each layer is processed once all of
        it has arrived. The iterator runs on the reader rank while the other
        ranks wait in the reload: it must not wait on them (a gather over the
        same ranks). An exception it raises fails the reload on every rank (a
        CheckpointError; after the first segment, parameters already written
        hold the new weights unless ``atomic``). With "node" and "all" every
        rank gives the whole list and it is read before the reload.
    shards: sharded sources, instead of a path or an iterator: on EVERY rank, the
        boxes of checkpoint tensors this rank holds, as (name, tensor, full_shape,
        offsets) tuples: ``tensor`` (CPU) holds the elements of the tensor ``name``
        of shape ``full_shape`` from ``offsets`` on along each dimension (a
        trainer's row or column slice, a whole tensor with zero offsets, an
        expert); ``[]`` on a rank that holds nothing. The ranks move each needed box point to point
        from a rank that holds it; a range no rank holds, or ranks holding
        different bytes where their boxes overlap, is a ValidationError on every
        rank before any write. Checkpoint format, readers="one".
    serving_ranks: with shards, the world ranks that serve, [0, serving_ranks);
        the ranks after them (a trainer's, in the same MPI job) hold no
        parameters (``params`` empty) and only send their shards. 0: every rank
        serves. tp_size defaults to serving_ranks.
    is_checkpoint_format: checkpoint format (through the weight loaders) or kernel
        format (already processed and sharded: copied by name).
    quantization: None, "int8", "fp8" (online FP8, a scale per tensor) or
        "fp8-block" (online FP8, a scale per 128 x 128 block); lora, expert_parallel: the
        model's layout.
    derived_views: the model holds the family's derived parameters (DeepSeek's
        W_UK_T and W_UV) as views of their unquantized weights, as vLLM holds them
        of a bfloat16 kv_b_proj: they are not in ``params`` and the reload, which
        writes kv_b_proj, leaves them be. Otherwise they are parameters to pass.
    distribution: "scatter" (each rank gets its slice) or "broadcast".
    bucket_mb: bucket size in MiB; pipeline_depth: buckets in flight per rank
        (1: one at a time; 2: the next bucket is read while the last is moved and
        applied; 0, the default, chooses per rank: 2 where the rank has two cores
        of its own, else 1).
    readers: "one" (the reader rank reads and sends each rank its part), "node"
        (one reader per node reads for the ranks of its node and sends within
        it; a node that cannot open the weights is served by another node's
        reader) or "all" (every rank reads only its own
        slices; nothing is sent). With "node" and "all" every rank opens the
        same weights_path, or is given the same weights_iterator.
    ranks_per_node: with readers="node", world ranks [k*n, (k+1)*n) form node k;
        0 (default) asks MPI which ranks share memory.
    rotate_broadcast_roots: with readers="node", the node readers take turns
        reading the broadcast buckets, each sending its turns to every rank (each
        reads a share of those bytes, which then cross between nodes).
    transport: "mpi", or "nccl" for CUDA parameters (device buffers).
    workspace: a Workspace kept between reloads (staging buffers and the plan).
    atomic: all or nothing: every rank receives its whole shard into a second copy
        of its parameters (same memory: host or GPU), and only when every rank has
        it are the parameters overwritten; any failure before leaves every
        parameter on every rank as it was. Costs that copy's memory (refused with
        a UsageError on every rank where it cannot be had).
    require_complete: refuse (ValidationError, before any write) a source that
        lacks a parameter some rank needs; by default those are reported in the
        result and the rest is reloaded, as vLLM does. With it (and not
        ``atomic``) a weights_iterator is read whole before the reload, as with
        "node" and "all"; with ``atomic`` it is taken lazily and checked before
        the commit.
    checksums: the reader sends a CRC-32C of each rank's share of every bucket
        and each rank verifies it before applying (a mismatch: CommError on every
        rank); False skips both.
    zero_copy: broadcast a bucket straight from the memory-mapped file where it is
        one run of it (off by default: a freshly opened mapping is faulted in page
        by page, slower than reading into the send buffer).
    compare_replicas: with replicas (world larger than tp_size), ranks holding the
        same tp rank compare a CRC-32C of every parameter after the reload; a
        difference is a ValidationError on every rank. False skips it.
    read_timeout_s: seconds (at least 1) a reading rank may take to fill one
        bucket before the job is ended (a hung file system).
    fingerprint: also read every parameter back and CRC it (``fingerprint`` and
        ``crc32`` of the result); costs a pass over the model's memory.

    Returns a ReloadResult. Raises tpreload.Error subclasses. Every error found
    before the transfer (here or in the engine) is the same on every rank and has
    ``agreed`` True; one with ``agreed`` False was this rank's alone (a transfer
    that failed or timed out) and the process should end (see World).
    """
    world = world or _default_world or World()
    request = _tpreload.Request()
    descriptors, held = [], []
    try:  # a problem found here on one rank is raised on every rank, by the native call
        request.config = _os.fspath(config)
        request.tp_size = int(tp_size or 0)
        if weights_path is not None and weights_iterator is not None:
            raise UsageError("give weights_path or weights_iterator, not both")
        if weights_path is not None:
            request.weights_path = _os.fspath(weights_path)
        # (require_complete without atomic refuses before any write: it needs the whole list)
        lazy = str(readers) == "one" and not (require_complete and not atomic)
        if weights_iterator is not None and lazy:
            request.weights_stream = _stream(weights_iterator, is_checkpoint_format)
        elif weights_iterator is not None:
            request.weights_iterator = _iterator_descriptors(weights_iterator, is_checkpoint_format, held)
        if shards is not None:
            if weights_path is not None or weights_iterator is not None:
                raise UsageError("give shards, weights_path or weights_iterator, one of them")
            request.shards = _shard_descriptors(shards, held)
        request.checkpoint_format = bool(is_checkpoint_format)
        request.quantization = quantization or ""
        request.lora = bool(lora)
        request.expert_parallel = bool(expert_parallel)
        request.derived_views = bool(derived_views)
        request.distribution = str(distribution)
        request.bucket_mb = float(bucket_mb)
        request.pipeline_depth = int(pipeline_depth)
        request.reader_rank = int(reader_rank)
        request.readers = str(readers)
        request.ranks_per_node = int(ranks_per_node)
        request.rotate_broadcast_roots = bool(rotate_broadcast_roots)
        request.transport = str(transport)
        request.fingerprint = bool(fingerprint)
        request.atomic = bool(atomic)
        request.require_complete = bool(require_complete)
        request.checksums = bool(checksums)
        request.zero_copy = bool(zero_copy)
        request.compare_replicas = bool(compare_replicas)
        request.read_timeout_s = float(read_timeout_s)
        request.serving_ranks = int(serving_ranks)
        items = list(params.items() if hasattr(params, "items") else params)
        descriptors = [_describe(n, t) for n, t in items]
        _synchronize_cuda([t for _, t in items])
    except Exception as e:  # noqa: BLE001 (every problem becomes the same error on every rank)
        request.problem = _describe_exception(e)
        descriptors = []
    result = _tpreload.reload(world._native, descriptors, request, workspace)
    del held  # the reader is done with the iterator's tensors
    return ReloadResult(result)


def _describe_exception(e):
    """"Kind: message", also for an exception whose message cannot be made (its
    __str__ raises) or is not valid UTF-8 (a lone surrogate from a file name):
    that must not end this rank alone while its peers wait."""
    try:
        text = "%s: %s" % (type(e).__name__, e)
    except Exception:  # noqa: BLE001
        text = "%s (its message could not be printed)" % type(e).__name__
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def retain_freed_memory():
    """Keep the memory this process frees instead of handing it back to the kernel
    (glibc's trim and mmap thresholds), so that the next reload does not fault its
    buffers and the checkpoint's listing in again page by page. Process-wide: call
    it once in a process that reloads often. Returns False where the C library is
    not glibc (nothing changed)."""
    return _tpreload.retain_freed_memory()


def built_with_cuda():
    """Whether this build has the CUDA device and the NCCL transport."""
    return _tpreload.built_with_cuda()
