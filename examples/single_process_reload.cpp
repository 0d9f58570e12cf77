// The reload engine in one process, without MPI: a tp-1 server that swaps in new
// weights in place. The control plane is a one-rank communicator and the data
// moves in host memory; the same calls serve a tensor-parallel job when a
// program passes MPI's communicator and transport instead. This program links
// no MPI library (a test checks its dynamic dependencies).
//
//   build/examples/single_process_reload
#include <ATen/ATen.h>

#include <iostream>

#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/comm/communicator.h"
#include "tpreload/comm/data_transport.h"
#include "tpreload/core/log.h"
#include "tpreload/model/model.h"
#include "tpreload/model/torch_dtype.h"
#include "tpreload/reload/reload.h"

using namespace tpreload;

int main() {
  try {
    init_logging(0, 1, "warn");
    const ModelConfig config = parse_model_config(R"({"architectures": ["LlamaForCausalLM"],
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 100, "torch_dtype": "float32"})",
                                                  "example config");
    TensorParallelModel model(config, ModelOptions{});
    auto control = make_local_communicator();
    auto data = make_communicator_transport(*control);
    ReloadWorkspace workspace;
    const void* storage = model.parameter_for_reload("model.norm.weight").data_ptr();
    for (int step = 1; step <= 2; ++step) {
      std::vector<at::Tensor> keep;
      std::vector<InMemoryTensor> tensors;
      for (const auto& spec : checkpoint_tensor_specs(config)) {
        keep.push_back(at::full(spec.shape, 0.01 * step));
        tensors.push_back(
            {spec.name, DType::kFloat32, spec.shape, tensor_bytes(keep.back()), nullptr});
      }
      auto source = make_in_memory_source(std::move(tensors));
      const ReloadResult r =
          reload_weights(model, *control, *data, source.get(), ReloadOptions{}, &workspace);
      const float norm0 = model.parameter_for_reload("model.norm.weight")[0].item<float>();
      std::cout << "step " << step << ": " << r.loaded.size()
                << " parameters reloaded, complete: " << (r.complete() ? "yes" : "no")
                << ", model.norm.weight[0] = " << norm0 << ", same storage: "
                << (storage == model.parameter_for_reload("model.norm.weight").data_ptr() ? "yes"
                                                                                          : "no")
                << "\n";
      if (!r.complete() || norm0 != static_cast<float>(0.01 * step)) return 2;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "single_process_reload: " << e.what() << "\n";
    return 1;
  }
}
