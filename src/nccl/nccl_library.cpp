#include "nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "tpreload/comm/nccl_transport.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace nccl {
namespace {

// Owner of a dlopen handle (closed unless kept for the process).
struct Handle {
  void* h = nullptr;
  ~Handle() {
    if (h) dlclose(h);
  }
};

template <typename F>
void bind(void* handle, const std::string& path, const char* name, F& fn) {
  dlerror();
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!fn)
    raise<CommError>("NCCL library '", path, "' has no symbol ", name,
                     " (tpreload needs NCCL >= ", kMinNcclVersion / 10000, ".",
                     kMinNcclVersion / 100 % 100, ")");
}

std::string resolve_path(const std::string& path) {
  if (!path.empty()) return path;
  if (const char* env = std::getenv("TPRELOAD_NCCL_LIBRARY"); env && *env) return env;
  return "libnccl.so.2";
}

// Open and bind `path`; the handle stays with `out_handle`.
Library open_library(const std::string& path, Handle& out_handle) {
  out_handle.h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!out_handle.h) {
    const char* why = dlerror();
    raise<CommError>("no NCCL: '", path, "' cannot be loaded (", why ? why : "?",
                     "); install NCCL or set TPRELOAD_NCCL_LIBRARY to its libnccl.so.2");
  }
  Library lib;
  lib.path = path;
  void* h = out_handle.h;
  bind(h, path, "ncclGetVersion", lib.GetVersion);
  bind(h, path, "ncclGetUniqueId", lib.GetUniqueId);
  bind(h, path, "ncclCommInitRankConfig", lib.CommInitRankConfig);
  bind(h, path, "ncclCommGetAsyncError", lib.CommGetAsyncError);
  bind(h, path, "ncclCommAbort", lib.CommAbort);
  bind(h, path, "ncclCommFinalize", lib.CommFinalize);
  bind(h, path, "ncclCommDestroy", lib.CommDestroy);
  bind(h, path, "ncclBroadcast", lib.Broadcast);
  bind(h, path, "ncclSend", lib.Send);
  bind(h, path, "ncclRecv", lib.Recv);
  bind(h, path, "ncclGroupStart", lib.GroupStart);
  bind(h, path, "ncclGroupEnd", lib.GroupEnd);
  bind(h, path, "ncclGetErrorString", lib.GetErrorString);
  bind(h, path, "ncclGetLastError", lib.GetLastError);
  if (lib.GetVersion(&lib.version) != ncclSuccess)
    raise<CommError>("NCCL library '", path, "': ncclGetVersion failed");
  if (lib.version < kMinNcclVersion)
    raise<CommError>("NCCL library '", path, "' is version ", lib.version,
                     "; tpreload needs >= ", kMinNcclVersion);
  return lib;
}

std::mutex g_mutex;
Library* g_library = nullptr;  // loaded once, kept for the process

}  // namespace

const Library& library() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_library) raise<UsageError>("NCCL is not loaded (call load_nccl() first)");
  return *g_library;
}

std::string result_text(ncclResult_t result) {
  const char* text = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_library) text = g_library->GetErrorString(result);
  }
  return detail::concat("NCCL result ", static_cast<int>(result), " (", text ? text : "?", ")");
}

}  // namespace nccl

namespace detail {

[[noreturn]] void raise_nccl_error(int code, const char* expr, const char* file, int line) {
  raise<CommError>(expr, " failed with ", nccl::result_text(static_cast<ncclResult_t>(code)),
                   " at ", file, ":", line);
}

}  // namespace detail

NcclLibraryInfo load_nccl(const std::string& path) {
  std::lock_guard<std::mutex> lock(nccl::g_mutex);
  if (nccl::g_library) return {nccl::g_library->path, nccl::g_library->version};
  nccl::Handle handle;
  auto lib = std::make_unique<nccl::Library>(nccl::open_library(nccl::resolve_path(path), handle));
  handle.h = nullptr;  // kept for the process: NCCL's threads may outlive any owner
  nccl::g_library = lib.release();
  return {nccl::g_library->path, nccl::g_library->version};
}

NcclLibraryInfo check_nccl_library(const std::string& path) {
  nccl::Handle handle;
  const nccl::Library lib = nccl::open_library(nccl::resolve_path(path), handle);
  return {lib.path, lib.version};
}

}  // namespace tpreload
