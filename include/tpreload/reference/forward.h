// The reference forward pass: logits from a TensorParallelModel's parameters,
// in plain LibTorch on the CPU (float32 compute), for every family the model
// layer knows. No part of a reload uses it: the demo, the examples and the
// tests run it to show that reloaded weights compute what the checkpoint's do.
// Weights are read as they are stored: int8 times its row scales, FP8 codes of
// every scheme times their scales, parameters in device memory copied over.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tpreload {

class Communicator;
class TensorParallelModel;

// Logits [tokens, vocab_size] (float32, on the host) for one sequence.
// Collective over `tp_comm`, whose size and rank must equal the model's
// tp_size and tp_rank (UsageError otherwise, before any collective); a token
// outside the vocabulary is a UsageError too.
at::Tensor reference_forward(const TensorParallelModel& model,
                             const std::vector<std::int64_t>& tokens, Communicator& tp_comm);

}  // namespace tpreload
