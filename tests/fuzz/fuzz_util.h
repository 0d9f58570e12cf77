// Shared by the libFuzzer targets: a scratch directory per process, and the
// rule every target enforces: malformed input may only raise tpreload's own
// errors (anything else, a crash, a leak or undefined behaviour is a finding).
#pragma once

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "tpreload/core/error.h"

namespace tpreload::fuzz {

inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/tpreload-fuzz-XXXXXX";
    if (!mkdtemp(tmpl)) abort();
    return std::string(tmpl);
  }();
  return dir;
}

inline void write_file(const std::string& path, const std::uint8_t* data, std::size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) abort();
  if (size && std::fwrite(data, 1, size, f) != size) abort();
  std::fclose(f);
}

// Runs `parse`; tpreload::Error is the expected way to refuse input.
template <typename F>
void expect_only_our_errors(F&& parse) {
  try {
    parse();
  } catch (const Error&) {
  }
}

}  // namespace tpreload::fuzz
