// Reload reports: a human summary and the JSON document reload_runner writes with
// --report (schema in docs/REPORT.md), including per-rank CRC-32 fingerprints of
// every parameter as stored after the reload.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tpreload/reload/reload.h"

namespace tpreload {

class Communicator;
class ReloadTarget;

// Per-rank fingerprints of every parameter (zlib CRC-32 of its bytes).
struct ParamFingerprint {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::kFloat32;
  std::vector<std::uint32_t> crc32_by_rank;  // index: world rank
};

// COLLECTIVE over `world`: every rank learns every rank's fingerprints, sorted by
// name. Every rank's model must have the same parameter names (true for one model
// config); if not, every rank throws the same Agreed<UsageError>. Parameters in
// device memory are read back in bounded chunks; a device that does not finish
// one within `device_timeout`, on any rank, is the same Agreed<CommError> on
// every rank.
std::vector<ParamFingerprint> gather_fingerprints(
    ReloadTarget& model, Communicator& world,
    std::chrono::milliseconds device_timeout = std::chrono::minutes(5));

// One fingerprint of the whole model across ranks: FNV-1a (64-bit, the
// standard offset basis: tpreload/core/fnv.h) over, for each rank in order and
// each parameter in `fingerprints`' order (by name), the name's bytes then the
// CRC-32 as 4 little-endian bytes; 16 lowercase hex digits. Equal models on
// equal worlds have equal fingerprints.
std::string model_fingerprint(const std::vector<ParamFingerprint>& fingerprints);

struct ReportContext {
  int world_size = 1;
  int tp_size = 1;
  std::string transport = "mpi";
};

// The JSON report (pretty-printed) of one reload.
std::string report_json(const ReloadResult& result, const ReportContext& context,
                        const std::vector<ParamFingerprint>& fingerprints);

// A few lines for humans: bytes, GB/s, seconds per phase, names not loaded.
std::string summary_text(const ReloadResult& result);

}  // namespace tpreload
