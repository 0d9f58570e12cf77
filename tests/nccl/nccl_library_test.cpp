// The NCCL loader's error paths and the installed library, without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>

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

}  // namespace
}  // namespace tpreload
