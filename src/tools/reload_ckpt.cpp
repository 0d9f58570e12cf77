// reload_ckpt: generate, inspect, convert and verify checkpoints (placeholder
// until the checkpoint layer lands).
#include <iostream>

int main() {
  std::cerr << "reload_ckpt: not implemented yet\n";
  return 2;
}
