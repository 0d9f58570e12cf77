// Precompiled header shared by the targets that use LibTorch (model, reload, their
// tests and programs). ATen/ATen.h brings tensors and operators for ~7 s of
// compile time; torch/torch.h (28 s) is never included.
#pragma once
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>
