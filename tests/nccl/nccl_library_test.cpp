// The NCCL loader's error paths and the installed library, without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tpreload/comm/communicator.h"
#include "tpreload/comm/nccl_transport.h"
#include "tpreload/core/error.h"

namespace tpreload {
namespace {

std::string message_of(const std::string& path) {
  try {
    check_nccl_library(path);
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

TEST(NcclLibrary, AMissingLibraryNamesThePathAndTheFix) {
  const std::string m = message_of("/nonexistent/libnccl.so.2");
  EXPECT_NE(m.find("no NCCL: '/nonexistent/libnccl.so.2' cannot be loaded"), std::string::npos)
      << m;
  EXPECT_NE(m.find("TPRELOAD_NCCL_LIBRARY"), std::string::npos) << m;
}

TEST(NcclLibrary, ALibraryWithoutNcclSymbolsIsRefusedNamingTheSymbol) {
  // zlib is there on every machine that builds tpreload and has none of NCCL's symbols.
  const std::string m = message_of("libz.so.1");
  EXPECT_NE(m.find("NCCL library 'libz.so.1' has no symbol ncclGetVersion"), std::string::npos)
      << m;
}

TEST(NcclLibrary, TheEnvironmentVariableChoosesTheLibrary) {
  setenv("TPRELOAD_NCCL_LIBRARY", "/nonexistent/from-env.so", 1);
  const std::string m = message_of("");
  unsetenv("TPRELOAD_NCCL_LIBRARY");
  EXPECT_NE(m.find("'/nonexistent/from-env.so'"), std::string::npos) << m;
}

// The toolkit this machine kind carries (CUDA 13.0 with NCCL 2.28.9): loading and
// asking the version needs no GPU.
TEST(NcclLibrary, TheInstalledLibraryLoadsAndIsRecentEnough) {
  const NcclLibraryInfo info = check_nccl_library("libnccl.so.2");
  EXPECT_GE(info.version, kMinNcclVersion);
  EXPECT_EQ(info.path, "libnccl.so.2");
}

std::string transport_error(std::shared_ptr<Device> device, const NcclOptions& options) {
  auto control = make_local_communicator();
  try {
    make_nccl_transport(*control, std::move(device), options);
  } catch (const CommError& e) {
    return e.what();
  }
  return "no error";
}

// What can be refused is refused before anything is created, the same on every
// rank: a timeout that is not positive or overflows the clock's deadline, a
// device that is not a CUDA device.
TEST(NcclTransport, ItsOptionsAndDeviceAreCheckedFirst) {
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(0);
  EXPECT_EQ(transport_error(nullptr, o),
            "setting up NCCL failed on rank 0/1: NcclOptions::timeout must be positive and at "
            "most a year (" +
                std::to_string(366LL * 24 * 3600 * 1000) + " ms), got 0 ms");
  EXPECT_EQ(transport_error(nullptr, {}),
            "setting up NCCL failed on rank 0/1: the NCCL transport needs a CUDA device, got none");
}

}  // namespace
}  // namespace tpreload
