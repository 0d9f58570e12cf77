#include <algorithm>
#include <cstring>

#include "tpreload/comm/communicator.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void broadcast(MutableBytes, int root) override { check_root(root); }
  void scatterv(ConstBytes send, const std::vector<ByteRange>& ranges, MutableBytes recv,
                int root) override {
    check_root(root);
    detail::check_scatter_arguments("local scatterv", 0, 1, send, ranges, recv, true);
    std::memmove(recv.data, send.data + ranges[0].offset, ranges[0].length);  // may be in place
  }
  void allreduce_bits(std::uint64_t*, std::size_t, BitOp) override {}
  void allreduce_ints(std::int64_t*, std::size_t, IntOp) override {}
  void allreduce_floats(float*, std::size_t) override {}
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    return std::make_unique<LocalCommunicator>();
  }
  [[noreturn]] void abort(int code) noexcept override { std::_Exit(code); }

 private:
  static void check_root(int root) {
    if (root != 0) raise<UsageError>("local communicator: root ", root, " is not rank 0");
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace tpreload
