// The parameter sink: where every parameter of one rank lives (host or device
// memory, owned by a model or borrowed from a caller), and the one way bytes are
// written into it. Parameters are addressed by slot (their index in
// ShardingRules::params()), never by name, once a reload is planned. Writes never
// reallocate: storage pointers, shapes and dtypes stay as they were. No torch here.
//
// Host memory is written with memcpy and the CPU int8 kernel, done when the call
// returns. Device memory is written through a stream of the sink's device
// (strided device copies, the device int8 kernel, fills), asynchronously: flush()
// waits for everything written so far. The source bytes of a write are in the
// sink's memory space.
//
// Parameters are written as rows of their last dimension (param_rows in
// row_writes.h). The sink also tracks which parameters a load filled
// (begin_load, mark_loaded): a stacked parameter counts as loaded once every
// one of its shards (ParamSpec::shards) did.
//
// FP8 processing: a per-tensor FP8 checkpoint's scale write
// (WriteKind::kStageScale) lands in the sink's staging, one float32 per shard
// of its parameter; process_layer() requantizes the layer's weights and writes
// their scales. An online FP8 weight's rows (kStageRows), in the model's dtype,
// are quantized as each unit (an expert; per block on the host a band of 128
// rows) completes, staged only while it is in parts (on a device, always).
//
// Atomic reloads: begin_shadow() gives every parameter a second copy in the same
// memory space (holding its current bytes) and sends every later write, zero and
// CRC there; commit_shadow() copies it over the parameters, discard_shadow()
// drops it, leaving the parameters as they were.
//
// Not thread-safe: one thread writes at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tpreload/comm/device.h"
#include "tpreload/comm/memory.h"
#include "tpreload/core/span.h"
#include "tpreload/model/row_writes.h"

namespace tpreload {

// One parameter's contiguous, row-major bytes.
struct ParamStorage {
  std::byte* data = nullptr;
  std::uint64_t bytes = 0;
};

class ParameterSink {
 public:
  // `storage[i]` holds rules.params()[i] (its exact byte size); `device` null for
  // host memory, else the device whose memory holds every parameter. Throws
  // ModelError for a storage whose size differs from its spec, naming it.
  ParameterSink(const ShardingRules& rules, std::vector<ParamStorage> storage,
                std::shared_ptr<Device> device = nullptr);
  // A sink of a rank that holds none of the parameters (a rank that only
  // sends sharded sources, push_shards): it tracks nothing loaded and takes
  // no write (ModelError, naming the parameter).
  struct NoParameters {};
  ParameterSink(const ShardingRules& rules, NoParameters);
  // False for a NoParameters sink.
  bool holds_parameters() const { return holds_parameters_; }
  ~ParameterSink();
  ParameterSink(const ParameterSink&) = delete;
  ParameterSink& operator=(const ParameterSink&) = delete;

  const ShardingRules& rules() const { return rules_; }
  MemoryKind memory() const { return device_ ? MemoryKind::kDevice : MemoryKind::kHost; }
  Device* device() const { return device_.get(); }
  std::size_t size() const { return storage_.size(); }
  // Where writes to `slot` go: the parameter, or its shadow copy while one is open.
  const ParamStorage& storage(ParamSlot slot) const { return storage_.at(slot); }

  // --- writes (source bytes in memory()) ---
  // Throws ModelError when the rows fall outside the parameter (never for a write
  // resolved from a placement that passed preflight).
  void write(const RowWrite& w, const std::byte* src);
  // For a write that is a plain copy of contiguous rows (kCopy, src_pitch equal
  // to the parameter's row width) into host memory: where its rows go, for a
  // caller that places the bytes there itself (a read straight from a file);
  // nullopt for any other write. Counts as the write (the slot is touched);
  // throws as write() does.
  std::optional<MutableBytes> host_rows(const RowWrite& w);
  // Counts a write whose rows a caller placed itself, from an earlier
  // host_rows() or a placement resolved against storage(): the slot is touched.
  // Throws as write() does.
  void count_placed(const RowWrite& w);
  void zero(const RowZero& z);
  // Wait until every write so far landed (device); no-op on the host. Throws
  // CommTimeoutError naming the device after `timeout`.
  void flush(std::chrono::milliseconds timeout = std::chrono::minutes(5));

  // Bytes held for FP8 processing, in the sink's memory space: staged
  // per-tensor scales and online FP8's staged weight rows (kept from one
  // reload to the next, so also the most held at once).
  std::uint64_t processing_staging_bytes() const;

  // --- processing ---
  // Processes decoder layer `layer` on tp rank `tp_rank` once its parts arrived
  // (ShardingRules::scale_steps; nothing for a model without any): each step
  // whose weight and staged scale came in this load runs once, into storage()
  // (a shadow while one is open), and has landed when this returns. Throws
  // ModelError naming the parameter when this load brought a step's weight or
  // scales only in part (a fused weight is requantized to the largest of all
  // its parts' scales).
  // Then the family's post-reload steps of the layer (ShardingRules::
  // derived_steps) whose weight this load brought, from all of it (ModelError
  // naming both parameters when it brought part of the weight or its scale).
  void process_layer(std::int64_t layer, int tp_rank);
  // Every layer process_layer has not processed since begin_load().
  void process_all(int tp_rank);

  // --- load tracking ---
  static constexpr std::uint32_t kAllShards = ~std::uint32_t{0};
  void begin_load();
  // Shard `shard` of the parameter arrived (kAllShards: the whole of it).
  void mark_loaded(ParamSlot slot, std::uint32_t shard);
  bool loaded(ParamSlot slot) const;
  // Of the parameters of decoder layer `layer` a load in `format` must fill
  // (expected_slots): whether this load brought all of them, part, or none.
  // A load whose extent is not known ahead (a stream) processes a layer once
  // it has all of it, as vLLM's layerwise reload does.
  Brought layer_brought(std::int64_t layer, WeightFormat format) const;
  // Slots a load in `format` must fill, in slot order (which is name order):
  // weight_scale only in kernel format.
  std::vector<ParamSlot> expected_slots(WeightFormat format) const;
  // Their names (sorted).
  std::vector<std::string> expected_names(WeightFormat format) const;
  // Expected names filled since begin_load() (sorted).
  std::vector<std::string> loaded_names(WeightFormat format) const;

  // Parameters written since begin_load() (even partly), sorted by name: after
  // a failed reload, those that may hold a mix of old and new bytes.
  std::vector<std::string> touched_names() const;

  // --- atomic reloads ---
  // The bytes a shadow takes: every parameter once more.
  std::uint64_t total_bytes() const;
  // Allocates the shadow in the sink's memory space and copies the parameters
  // into it. Throws CommError (from the allocator) naming the memory when it
  // cannot be had, CommTimeoutError when the device does not finish the copy
  // within `timeout` (the shadow is then abandoned, never freed, as the device
  // may still write it), ModelError when a copy fails; the sink is then unchanged.
  void begin_shadow(std::chrono::milliseconds timeout = std::chrono::minutes(5));
  bool shadowed() const { return static_cast<bool>(shadow_); }
  // Copies the shadow over the parameters (waiting for the device copies up to
  // `timeout`) and frees it. Throws CommTimeoutError naming the device when
  // the writes into the shadow or the copies do not finish in time: the
  // parameters may then hold a mix of old and new bytes.
  void commit_shadow(std::chrono::milliseconds timeout = std::chrono::minutes(5));
  // Whether a commit began copying since begin_load(): the parameters
  // written (touched_names) may have changed even in an atomic reload.
  bool commit_began() const { return commit_began_; }
  // Frees the shadow: the parameters hold what they held at begin_shadow().
  // Device writes still queued into it must land first; when they do not
  // within `timeout` (a stuck device) it is abandoned instead of freed.
  void discard_shadow(std::chrono::milliseconds timeout = std::chrono::minutes(5)) noexcept;

  // zlib CRC-32 of a parameter's bytes; device memory is copied back through a
  // pinned buffer of at most `chunk_bytes` at a time. A device that does not
  // finish a copy within `timeout` is a CommTimeoutError naming it, and the
  // buffer it may still write is abandoned (never freed).
  std::uint32_t crc32(ParamSlot slot, std::uint64_t chunk_bytes = std::uint64_t{16} << 20,
                      std::chrono::milliseconds timeout = std::chrono::minutes(5));
  // The same for any bytes in the sink's memory space (e.g. LoRA adapters beside
  // the parameters); `what` names them in errors.
  std::uint32_t crc32(const std::byte* data, std::uint64_t bytes, const std::string& what,
                      std::uint64_t chunk_bytes = std::uint64_t{16} << 20,
                      std::chrono::milliseconds timeout = std::chrono::minutes(5));

  // A CRC-32C digest of bytes in the sink's memory space, computed where they live
  // (a device kernel for device memory; only the 4 KiB block sums come back).
  // Ranges up to kDigestChunk bytes: their CRC-32C; longer ones: the CRC-32C of
  // their chunks' CRC-32Cs (little-endian), the same on host and device.
  static constexpr std::uint64_t kDigestChunk = std::uint64_t{256} << 20;
  // A device that does not finish within `timeout`: as crc32().
  std::uint32_t crc32c(const std::byte* data, std::uint64_t bytes, const std::string& what,
                       std::chrono::milliseconds timeout = std::chrono::minutes(5));

 private:
  ParameterSink(const ShardingRules& rules, std::vector<ParamStorage> storage,
                std::shared_ptr<Device> device, bool holds_parameters);
  void begin_write(const RowWrite& w, const ParamSpec& param);
  void write_host(const RowWrite& w, const ParamSpec& param, const std::byte* src);
  void write_device(const RowWrite& w, const ParamSpec& param, const std::byte* src);
  DeviceStream& stream();
  // The one pinned buffer device bytes are read back through (CRCs, digests),
  // grown to `bytes` where smaller: pinning and freeing one per call would cost
  // a cudaFreeHost each, which waits for the whole device.
  Buffer& readback(std::uint64_t bytes);

  void copy_all(const std::vector<ParamStorage>& from, const std::vector<ParamStorage>& to);
  void stage(const RowWrite& w, const ParamSpec& param, const std::byte* src);
  void stage_rows(const RowWrite& w, const ParamSpec& param, const std::byte* src);
  bool any_loaded(ParamSlot slot) const;
  Brought brought(ParamSlot slot) const;
  void derive_layer(std::int64_t layer, int tp_rank);

  const ShardingRules& rules_;
  bool holds_parameters_ = true;
  std::vector<ParamStorage> storage_;  // where writes go: the parameters, or the shadow
  std::vector<ParamStorage> params_;   // the parameters themselves
  Buffer shadow_;
  std::vector<bool> touched_;
  bool commit_began_ = false;
  std::shared_ptr<Device> device_;
  std::unique_ptr<DeviceStream> stream_;
  Buffer readback_;  // (after device_: freed before the device's allocator goes)
  // Staged per-tensor FP8 scales (ParamSpec::staged), in the sink's memory
  // space: slot s's shards at staging_ + staged_at_[s] floats.
  Buffer staging_;
  std::vector<std::uint64_t> staged_at_;
  // Online FP8 units' staging buffers done with (partial_units_), reused by the
  // next units that fit, kept warm from one reload to the next.
  std::vector<Buffer> spare_rows_;
  Buffer rows_buffer(std::uint64_t bytes);
  // Per slot, per expert (one without experts): the amax of the staged rows so
  // far, taken as they land (host memory, per-tensor online FP8).
  std::vector<std::vector<float>> staged_amax_;
  // A weight's rows in bands of `block` rows of one expert (the last of each
  // expert fewer), band b a row of its grid; with `block` the expert's rows,
  // one band per expert.
  struct Bands {
    std::int64_t experts, per_expert, per_band_row, block;  // per_band_row: bands per expert
    std::int64_t count() const { return experts * per_band_row; }
    std::int64_t of_row(std::int64_t r) const {
      return r / per_expert * per_band_row + r % per_expert / block;
    }
    std::int64_t first(std::int64_t band) const {
      return band / per_band_row * per_expert + band % per_band_row * block;
    }
    std::int64_t end(std::int64_t band) const {
      const std::int64_t f = first(band), expert_end = (band / per_band_row + 1) * per_expert;
      return f + block < expert_end ? f + block : expert_end;
    }
  };
  static Bands bands_of(const ParamSpec& param, std::int64_t block);
  // Online FP8 quantizes a weight in units: its experts (the whole weight
  // without experts), per block on the host its bands.
  Bands units_of(const ParamSpec& param) const;
  void quantize_unit(ParamSlot slot, const Bands& units, std::int64_t unit, const std::byte* x,
                     bool staged);
  void check_units_quantized(const ScaleStep& step, int tp_rank) const;
  // Per slot, per unit: rows written so far in this load (a unit is quantized
  // when they reach its height); empty until the load's first write of the
  // weight, which also starts its amaxes again, and again once its layer is
  // processed.
  std::vector<std::vector<std::int64_t>> unit_rows_;
  // The units that came in parts, by (slot, unit): their rows so far (the
  // unit's row i at i rows in), until the last lands.
  std::map<std::pair<ParamSlot, std::int64_t>, Buffer> partial_units_;
  Buffer round_scratch_;          // rows of another dtype rounded to the model's on their way in
  std::vector<ScaleStep> steps_;  // scale_steps(steps_rank_), made on first use
  int steps_rank_ = -1;
  std::vector<std::int64_t> processed_;  // layers processed since begin_load()
  // Shard bits since begin_load(): slot s owns bits [first_bit_[s], first_bit_[s + 1]).
  std::vector<std::uint64_t> first_bit_;
  std::vector<std::uint64_t> loaded_;
};

}  // namespace tpreload
