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

// Read by the signal handler without locks: a slot is in use while `end` is
// non-zero; `begin` is written before `end` is published and cleared after.
struct Slot {
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::uintptr_t> end{0};
  std::atomic<std::uint64_t> faults{0};
};

Slot g_slots[MappingGuard::kSlots];
std::mutex g_register;           // registration and handler installation
struct sigaction g_previous {};  // the handler ours replaced
std::atomic<bool> g_have_previous{false};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (Slot& s : g_slots) {
    const std::uintptr_t end = s.end.load(std::memory_order_acquire);
    if (end == 0 || addr < s.begin.load(std::memory_order_relaxed) || addr >= end) continue;
    const std::uintptr_t page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    void* at = reinterpret_cast<void*>(addr & ~(page - 1));
    // mmap is a plain system call on Linux (no locks in user space): zeros over
    // the page, then the faulting read is retried and completes.
    if (::mmap(at, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
      s.faults.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    break;
  }
  // Not ours (or the page could not be replaced): what would have happened
  // without us.
  if (g_have_previous.load()) {
    const struct sigaction& p = g_previous;
    if ((p.sa_flags & SA_SIGINFO) && p.sa_sigaction) return p.sa_sigaction(sig, info, context);
    if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN && p.sa_handler)
      return p.sa_handler(sig);
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGBUS, &dfl, nullptr);
  ::raise(SIGBUS);  // ends the process as SIGBUS would have (also one sent by kill)
}

// Installs on_sigbus unless it is the current handler (caller holds g_register).
void install_handler() {
  struct sigaction current {};
  ::sigaction(SIGBUS, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) return;
  struct sigaction ours {};
  ours.sa_sigaction = on_sigbus;
  ours.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&ours.sa_mask);
  g_previous = current;
  g_have_previous.store(true);
  ::sigaction(SIGBUS, &ours, nullptr);
}

}  // namespace

MappingGuard::MappingGuard(const std::byte* data, std::uint64_t size) {
  if (data == nullptr || size == 0) return;
  std::lock_guard<std::mutex> lock(g_register);
  install_handler();
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    if (s.end.load(std::memory_order_relaxed) != 0) continue;
    s.faults.store(0, std::memory_order_relaxed);
    s.begin.store(reinterpret_cast<std::uintptr_t>(data), std::memory_order_relaxed);
    s.end.store(reinterpret_cast<std::uintptr_t>(data) + size, std::memory_order_release);
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
  g_slots[slot_].end.store(0, std::memory_order_release);
  g_slots[slot_].begin.store(0, std::memory_order_relaxed);
  slot_ = -1;
}

std::uint64_t MappingGuard::faults() const {
  return slot_ < 0 ? 0 : g_slots[slot_].faults.load(std::memory_order_relaxed);
}

}  // namespace tpreload::detail
