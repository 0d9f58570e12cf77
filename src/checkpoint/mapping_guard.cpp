#include "mapping_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <utility>

#include "tpreload/core/error.h"

namespace tpreload::detail {
namespace {

// Read by the signal handler without locks, seqlock style: a writer (holding
// g_register) makes `generation` odd, changes the range, and makes it even
// again; the handler uses a range only if it read the same even generation
// before and after it. A slot is in use while `end` is non-zero.
struct Slot {
  std::atomic<std::uint64_t> generation{0};
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::uintptr_t> end{0};
  std::atomic<std::uint64_t> faults{0};
};

Slot g_slots[MappingGuard::kSlots];
std::mutex g_register;           // registration
std::once_flag g_installed;      // the handler is installed once
struct sigaction g_previous {};  // the handler ours replaced (written once, before)
std::uintptr_t g_page = 4096;    // the page size (read once, before)

void set_range(Slot& s, std::uintptr_t begin, std::uintptr_t end) {
  s.generation.fetch_add(1, std::memory_order_acq_rel);  // odd: being changed
  s.begin.store(begin, std::memory_order_relaxed);
  s.end.store(end, std::memory_order_relaxed);
  s.generation.fetch_add(1, std::memory_order_release);  // even: stable
}

// Whether `addr` lies in a registered mapping whose range was read consistently.
Slot* owner_of(std::uintptr_t addr) {
  for (Slot& s : g_slots) {
    const std::uint64_t g1 = s.generation.load(std::memory_order_acquire);
    if (g1 & 1) continue;
    const std::uintptr_t begin = s.begin.load(std::memory_order_relaxed);
    const std::uintptr_t end = s.end.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.generation.load(std::memory_order_relaxed) != g1) continue;
    if (end != 0 && addr >= begin && addr < end) return &s;
  }
  return nullptr;
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  // Only faults the kernel raised (si_code > 0) have a meaningful address; a
  // SIGBUS sent by kill() or raise() is never ours.
  if (info->si_code > 0) {
    const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
    if (Slot* s = owner_of(addr)) {
      void* at = reinterpret_cast<void*>(addr & ~(g_page - 1));
      // mmap is a plain system call on Linux (no locks in user space): zeros
      // over the page, then the faulting read is retried and completes.
      if (::mmap(at, g_page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
          MAP_FAILED) {
        s->faults.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
  }
  // Not ours (or the page could not be replaced): what would have happened
  // without us.
  const struct sigaction& p = g_previous;
  if ((p.sa_flags & SA_SIGINFO) && p.sa_sigaction) return p.sa_sigaction(sig, info, context);
  if (!(p.sa_flags & SA_SIGINFO) && p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN &&
      p.sa_handler)
    return p.sa_handler(sig);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGBUS, &dfl, nullptr);
  ::raise(SIGBUS);  // ends the process as SIGBUS would have (also one sent by kill)
}

// Once per process, at the first registration: a handler installed later by
// someone else and chaining to its predecessor would otherwise call ours, which
// would call it again.
void install_handler() {
  g_page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  struct sigaction ours {};
  ours.sa_sigaction = on_sigbus;
  ours.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&ours.sa_mask);
  ::sigaction(SIGBUS, &ours, &g_previous);
}

}  // namespace

MappingGuard::MappingGuard(const std::byte* data, std::uint64_t size) {
  if (data == nullptr || size == 0) return;
  std::call_once(g_installed, install_handler);
  std::lock_guard<std::mutex> lock(g_register);
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    if (s.end.load(std::memory_order_relaxed) != 0) continue;
    s.faults.store(0, std::memory_order_relaxed);
    set_range(s, reinterpret_cast<std::uintptr_t>(data),
              reinterpret_cast<std::uintptr_t>(data) + size);
    slot_ = i;
    return;
  }
  raise<CheckpointError>("more than ", kSlots, " checkpoint files are mapped at once");
}

MappingGuard::MappingGuard(MappingGuard&& other) noexcept : slot_(std::exchange(other.slot_, -1)) {}

MappingGuard& MappingGuard::operator=(MappingGuard&& other) noexcept {
  if (this != &other) {
    release();
    slot_ = std::exchange(other.slot_, -1);
  }
  return *this;
}

MappingGuard::~MappingGuard() {
  release();
}

void MappingGuard::release() noexcept {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(g_register);
  set_range(g_slots[slot_], 0, 0);
  slot_ = -1;
}

std::uint64_t MappingGuard::faults() const {
  return slot_ < 0 ? 0 : g_slots[slot_].faults.load(std::memory_order_relaxed);
}

}  // namespace tpreload::detail
