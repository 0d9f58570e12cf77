// header_bench: the cost of listing a safetensors file, the part of a small-tensor
// reload that grows with the tensor count. Parses the header of FILE (already in
// memory, so no I/O is timed) --reps times and prints the best time, per tensor.
// --general times the general parser alone (any JSON; what every header went
// through before the fast parser), without the layout check. --open times what a
// reload pays to list the checkpoint instead: open_weight_source() on FILE (the
// header read, parsed, the tensor list built, the file mapped) and closing it;
// with --known, each open is given the listing of an earlier open of the same
// file (what a reload with a kept plan does: the header is read and compared,
// not parsed).
//
//   build/bench/header_bench FILE [--general|--open [--known]], FILE e.g.
//   /tmp/tpreload-bench/small-tensors/model.safetensors
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "tpreload/checkpoint/safetensors.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"header_bench: safetensors header parse time (best of --reps)"};
  std::string path;
  int reps = 5;
  bool general = false;
  app.add_option("file", path, "A .safetensors file")->required();
  app.add_option("--reps", reps, "Parses to time")->capture_default_str();
  bool open = false, known = false;
  app.add_flag("--general", general, "Time the general (nlohmann SAX) parser alone");
  app.add_flag("--open", open, "Time opening and closing the file as a weight source");
  app.add_flag("--known", known,
               "With --open: give each open the listing of an earlier open of FILE");
  CLI11_PARSE(app, argc, argv);
  if (open) {
    using Clock = std::chrono::steady_clock;
    double best_open = 1e30, best_close = 1e30;
    std::size_t tensors = 0;
    try {
      const auto earlier = known ? tpreload::open_weight_source(path)->known_listing() : nullptr;
      for (int r = 0; r < reps; ++r) {
        const auto start = Clock::now();
        auto source = tpreload::open_weight_source(path, earlier);
        const auto opened = Clock::now();
        tensors = source->tensors().size();
        source.reset();
        best_open = std::min(best_open, std::chrono::duration<double>(opened - start).count());
        best_close =
            std::min(best_close, std::chrono::duration<double>(Clock::now() - opened).count());
      }
    } catch (const tpreload::Error& e) {
      std::fprintf(stderr, "header_bench: %s\n", e.what());
      return 1;
    }
    std::printf(
        "open_weight_source%s: %zu tensors: best of %d open %.1f ms (%.0f ns per tensor), "
        "close %.1f ms\n",
        known ? " with the known listing" : "", tensors, reps, best_open * 1e3,
        tensors ? best_open * 1e9 / static_cast<double>(tensors) : 0.0, best_close * 1e3);
    return 0;
  }
  std::ifstream in(path, std::ios::binary);
  unsigned char len[8] = {};
  if (!in.read(reinterpret_cast<char*>(len), 8)) {
    std::fprintf(stderr, "header_bench: cannot read '%s'\n", path.c_str());
    return 1;
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > tpreload::kSafetensorsMaxHeaderBytes) {
    std::fprintf(stderr, "header_bench: header length %llu too large\n",
                 static_cast<unsigned long long>(n));
    return 1;
  }
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  double best = 1e30;
  std::size_t tensors = 0;
  try {
    for (int r = 0; r < reps; ++r) {
      const auto start = std::chrono::steady_clock::now();
      tpreload::SafetensorsHeader header;
      if (general)
        tpreload::detail::parse_safetensors_entries_general(text, header, path);
      else
        header = tpreload::parse_safetensors_header(text, size, path);
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      tensors = header.tensors.size();
    }
  } catch (const tpreload::Error& e) {
    std::fprintf(stderr, "header_bench: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %zu tensors, %llu header bytes: best of %d %.1f ms, %.0f ns per tensor\n",
              general ? "general parser" : "parse_safetensors_header", tensors,
              static_cast<unsigned long long>(n), reps, best * 1e3,
              tensors ? best * 1e9 / static_cast<double>(tensors) : 0.0);
  return 0;
}
