// The bucket pipeline's reads and their integrity (pipeline_impl.h): the
// reader's fill of a bucket, summed as it is read; a receiver's verification
// of what it received against the reader's CRC-32Cs; and the read status the
// reader announces before each bucket, so that a failed read is the same
// error on every rank.
#include <algorithm>
#include <cstring>

#include "pipeline_impl.h"
#include "tpreload/checkpoint/weight_source.h"
#include "tpreload/core/log.h"
#include "tpreload/model/row_writes.h"

namespace tpreload::detail::pipeline_internal {

// Reader thread: the file into host memory, then (device transport) to the device.
void Pipeline::fill(Slot& slot) {
  const auto start = Clock::now();
  const Bucket& bucket = plan_.buckets[slot.bucket];
  // Summed as read, a step at a time while the step is in the core's cache:
  // what each rank of the group receives (its running CRC-32C in slot.sums).
  slot.sums.clear();
  slot.summed = 0;
  BucketReader::Filled sum;
  const bool sums = !all_read_ && summed(slot.bucket);
  if (sums) {
    slot.sums.assign(sum_count(slot.bucket), 0);
    sum = [&](int region, ConstBytes span) {
      const auto t = Clock::now();
      if (region < 0 && chained(slot.bucket)) {  // broadcast: the spans tile the bucket in order
        extend_chains(chains_.at(slot.bucket), slot.summed, span, &chains_checked_.at(slot.bucket),
                      slot.sums);
        slot.summed += span.size;
      } else if (region < 0) {  // (device memory: cut into blocks)
        for (std::uint64_t done = 0; done < span.size;) {
          const std::size_t k = static_cast<std::size_t>(slot.summed / kVerifyBlock);
          const std::uint64_t n = std::min(span.size - done, (k + 1) * kVerifyBlock - slot.summed);
          slot.sums.at(k) = crc32c_extend(slot.sums[k], span.data + done, n);
          done += n;
          slot.summed += n;
        }
      } else if (const int g = group_rank_of(region); g >= 0 && g != group_rank_) {
        std::uint32_t& crc = slot.sums[static_cast<std::size_t>(g)];
        crc = crc32c_extend(crc, span.data, span.size);  // (not sent to the group: not summed)
      }
      reader_checksum_ += since(t);
    };
  }
  if (all_read_) {  // nothing is sent, so nothing is summed
    slot.payload = files_->fill_own(slot.bucket, rank_, slot.recv);
  } else if (!spaces_.device_transport) {
    // Once the apply stopped (a failed write, a corrupted bucket), nothing more
    // goes into the parameters.
    const Placed own = apply_stopped_ ? Placed{} : placed(slot.bucket);
    if (own.spans) placing_.at(slot.bucket) = kPlaced;  // (its parameters may change from here on)
    slot.payload = node_read_ ? files_->fill_ranks(slot.bucket, members_, slot.send, sum, own)
                              : files_->fill(slot.bucket, slot.send, sum, own);
  } else {
    const ConstBytes host = node_read_
                                ? files_->fill_ranks(slot.bucket, members_, slot.read_stage, sum)
                                : files_->fill(slot.bucket, slot.read_stage, sum);
    if (!read_stream_) read_stream_ = spaces_.device->make_stream();
    if (host.size) read_stream_->copy(slot.send, host.data, host.size, CopyKind::kHostToDevice);
    synchronize(*read_stream_, options_.device_timeout,
                concat("copying bucket ", slot.bucket + 1, " (", bucket.bytes, " bytes) to ",
                       spaces_.device->describe()));
    slot.payload = ConstBytes(slot.send, bucket.bytes);
  }
  if (sums && !bucket.scatter && slot.summed != bucket.bytes)  // (the reader's own invariant)
    raise<Error>("bucket ", slot.bucket + 1, ": the reader summed ", slot.summed, " of its ",
                 bucket.bytes, " bytes in order (a broadcast bucket's spans must tile it)");
  // Bytes read through the file's mapping (zero-copy payloads, full rows) that
  // the file no longer backs read as zeros: this bucket is not sent.
  source_->check_mapped_reads();
  stats_.read += since(start);
}

std::string Pipeline::bucket_tensors(std::size_t bucket) const {
  std::string names;
  std::size_t listed = 0;
  const auto& pieces = plan_.buckets[bucket].pieces;
  for (const Piece& p : pieces) {
    if (listed == 6) {
      names += concat(" and ", pieces.size() - listed, " more");
      break;
    }
    names += (listed++ ? ", " : "") + metadata_.tensors[plan_.tensors[p.planned].index].name;
  }
  return names;
}

// What this rank checks of `bucket`, computed once per reload: its whole view
// of a scatter bucket; of a broadcast bucket in device memory, the kVerifyBlock
// blocks its writes read (from each write's src_offset to write_source_end), in
// order. (Chained broadcast buckets: verify_chains.)
const std::vector<Pipeline::Check>& Pipeline::checks(std::size_t bucket) {
  if (checks_.empty()) checks_.resize(plan_.buckets.size());
  auto& list = checks_[bucket];
  if (list) return *list;
  list.emplace();
  const Bucket& b = plan_.buckets[bucket];
  const std::uint64_t n = view_bytes(b);
  if (b.scatter) {
    list->push_back({0, n, 0});
    return *list;
  }
  std::vector<char> read(verify_blocks(n), 0);
  const auto& params = model_.rules().params();
  for (const RowWrite& w : applies_[bucket].writes) {
    const std::uint64_t end = std::min(n, write_source_end(w, params.at(w.slot)));
    for (std::uint64_t k = w.src_offset / kVerifyBlock; k * kVerifyBlock < end; ++k) read[k] = 1;
  }
  for (std::size_t k = 0; k < read.size(); ++k)
    if (read[k]) list->push_back({k * kVerifyBlock, std::min(n, (k + 1) * kVerifyBlock), k});
  return *list;
}

[[noreturn]] void Pipeline::raise_corrupted(const Slot& slot, const std::string& where,
                                            std::uint32_t got, std::uint32_t sent) const {
  const Bucket& bucket = plan_.buckets[slot.bucket];
  raise<CorruptedBucket>("bucket ", slot.bucket + 1, " of ", plan_.buckets.size(), " (",
                         view_bytes(bucket), " bytes of ", bucket_tensors(slot.bucket),
                         ") arrived corrupted on rank ", rank_, "/", control_.size(), where,
                         ": CRC-32C ", hex(got), ", the reader sent ", hex(sent),
                         "; none of it was applied");
}

// Apply thread, before anything of the bucket is written: the bytes this rank
// applies must be exactly the bytes the reader read (checks(): a bit flipped in
// broadcast bytes only other ranks use changes nothing here).
void Pipeline::verify(Slot& slot, const std::byte* view, bool device_memory) {
  if (slot.expected.empty()) return;
  if (chained(slot.bucket)) return verify_chains(slot, view);
  const auto& list = checks(slot.bucket);
  if (list.empty()) return;  // (nothing of it is applied here)
  const auto start = Clock::now();
  const std::uint64_t n = view_bytes(plan_.buckets[slot.bucket]);
  if (device_memory) {
    if (!apply_stream_) apply_stream_ = spaces_.device->make_stream();
    apply_stream_->crc32c_blocks(view, n, slot.block_sums);
    synchronize(
        *apply_stream_, options_.device_timeout,
        concat("checksumming bucket ", slot.bucket + 1, " on ", spaces_.device->describe()));
  }
  for (const Check& c : list) {
    const std::uint32_t got =
        device_memory
            ? crc32c_from_blocks(slot.block_sums + c.begin / kCrc32cBlock, c.end - c.begin)
            : crc32c(view + c.begin, c.end - c.begin);
    if (got == slot.expected.at(c.sum)) continue;
    stats_.checksum += since(start);
    raise_corrupted(slot,
                    c.begin == 0 && c.end == n
                        ? std::string()
                        : concat(" in its bytes [", c.begin, ", ", c.end, ")"),
                    got, slot.expected[c.sum]);
  }
  stats_.checksum += since(start);
}

// verify() of a broadcast bucket in host memory: the chains this rank's writes
// read, each summed over the whole view in one pass.
void Pipeline::verify_chains(Slot& slot, const std::byte* view) {
  const std::vector<char>& wanted = chains_read_.at(slot.bucket);
  if (std::find(wanted.begin(), wanted.end(), 1) == wanted.end()) return;
  const auto start = Clock::now();
  const ChainLayout& layout = chains_.at(slot.bucket);
  std::vector<std::uint32_t> got(wanted.size(), 0);
  extend_chains(layout, 0, ConstBytes(view, plan_.buckets[slot.bucket].bytes), &wanted, got);
  stats_.checksum += since(start);
  for (std::size_t c = 0; c < wanted.size(); ++c) {
    if (!wanted[c] || got[c] == slot.expected.at(c)) continue;
    const int chain = static_cast<int>(c);
    raise_corrupted(
        slot,
        concat(" in the ", chain_bytes(layout, chain), " bytes that ",
               chain + 1 == layout.chains ? std::string("several tensor-parallel ranks read")
                                          : concat("tensor-parallel rank ", chain, " reads")),
        got[c], slot.expected[c]);
  }
}

// COLLECTIVE over the group. Whether the group's reader read the bucket, with
// the CRC-32Cs of what each rank receives. A failed read is raised at once
// (Readers::kOne), or (kNode) false is returned on every rank of the node and
// the failure is agreed on over the world once every node has run.
bool Pipeline::announce_read_status(Slot& slot) {
  std::optional<std::string> problem;
  if (reader_) problem = slot.read_error;
  // [status, then the CRC-32C of what each rank receives]: one broadcast.
  const Bucket& bucket = plan_.buckets[slot.bucket];
  const std::size_t sums = sum_count(slot.bucket);
  std::vector<std::int64_t> message_head(1 + sums, 0);
  message_head[0] = problem ? kReadFailed : 0;
  if (reader_ && !problem)
    for (std::size_t i = 0; i < sums; ++i) message_head[1 + i] = slot.sums.at(i);
  // Within a node, an allreduce (the reader's values are the only ones not
  // zero): a rank whose transfer of the bucket before failed says so in it.
  if (node_read_)
    allreduce_ints(group_, message_head, IntOp::kMax);
  else
    group_.broadcast(MutableBytes(message_head.data(), message_head.size() * sizeof(std::int64_t)),
                     root_);
  const std::int64_t status = message_head[0];
  slot.expected.clear();
  if (status == 0 && sums && !reader_) {
    if (bucket.scatter)
      slot.expected.push_back(static_cast<std::uint32_t>(message_head[1 + group_rank_]));
    else
      for (std::size_t k = 0; k < sums; ++k)
        slot.expected.push_back(static_cast<std::uint32_t>(message_head[1 + k]));
  }
  if (status != 0 && !node_read_) raise_read_failure(slot.bucket, options_.reader_rank, problem);
  return status == 0;
}

// COLLECTIVE over the node (Readers::kNode), in place of the announcement of
// `bucket` by a rank whose transfer of the bucket before it failed: its node's
// ranks learn there that they stop (announce_read_status returns false), where
// they would otherwise wait for it.
void Pipeline::announce_failed_transfer(std::size_t bucket) {
  std::vector<std::int64_t> message_head(1 + sum_count(bucket), 0);
  message_head[0] = kTransferFailed;
  allreduce_ints(group_, message_head, IntOp::kMax);
}

// COLLECTIVE over the world, for a bucket one node reader sends to the world
// (rotated roots): whether its root read it, with the CRC-32C of what it sends,
// in one allreduce (the root's values are the only ones not zero). Returns
// whether the bucket goes out.
bool Pipeline::announce_world_status(Slot& slot) {
  const int root = world_root(slot.bucket);
  const std::size_t sums = sum_count(slot.bucket);  // (a broadcast bucket's chains or blocks)
  // [failed, the CRC-32Cs]: the world's maximum
  std::vector<std::int64_t> head(1 + sums, 0);
  if (rank_ == root) {
    if (slot.read_error)
      head[0] = 1;
    else
      for (std::size_t k = 0; k < sums; ++k) head[1 + k] = slot.sums.at(k);
  }
  allreduce_ints(control_, head, IntOp::kMax);
  slot.expected.clear();
  if (head[0] == 0 && rank_ != root)
    for (std::size_t k = 0; k < sums; ++k)
      slot.expected.push_back(static_cast<std::uint32_t>(head[1 + k]));
  return head[0] == 0;
}

// COLLECTIVE, Readers::kAll and kNode, once every rank has applied what it
// read: ranks (nodes) read on their own, with no world collective per bucket,
// so a failed read stops only the rank (node) that hit it. Every rank then
// raises the lowest failing reader's error (none: returns).
void Pipeline::agree_on_read_status(std::size_t bucket, const std::optional<std::string>& error) {
  const int n = control_.size();
  std::int64_t lowest = error ? n - rank_ : 0;
  control_.allreduce_ints(&lowest, 1, IntOp::kMax);
  if (lowest != 0) raise_read_failure(bucket, n - static_cast<int>(lowest), error);
}

// COLLECTIVE. `rank`'s failed read of `bucket` (known there), with its error
// (`mine` there), reaches every rank, which raises it.
void Pipeline::raise_read_failure(std::size_t bucket, int rank,
                                  const std::optional<std::string>& mine) {
  // [bucket, the error's length, whether the failing rank reads its own rows of
  // the bucket straight into its parameters]
  std::int64_t head[3] = {static_cast<std::int64_t>(bucket),
                          rank_ == rank ? static_cast<std::int64_t>(mine->size()) : 0,
                          rank_ == rank && !options_.atomic && placed_in_fill(bucket) ? 1 : 0};
  control_.broadcast(MutableBytes(head, sizeof head), rank);
  std::string message(static_cast<std::size_t>(head[1]), '\0');
  if (rank_ == rank) message = *mine;
  control_.broadcast(MutableBytes(message.data(), message.size()), rank);
  // Every rank raises this after the same broadcasts, with no transfer in flight.
  const bool world_bucket = world_root(static_cast<std::size_t>(head[0])) >= 0;
  // What had been applied: in atomic mode only to the second copy (the caller
  // adds that every parameter is as it was).
  const char* applied =
      options_.atomic ? ""
      : all_read_ ? "; every rank had applied the buckets it read before this failure (the others "
                    "all of theirs)"
      : world_bucket ? "; every rank stopped at this bucket: weights of earlier buckets were "
                       "already replaced"
      : node_read_   ? "; the ranks of that node had applied the buckets before it, the ranks of "
                       "every other node all of theirs"
      : head[0] > 0  ? "; weights of earlier buckets were already replaced"
                     : "";
  raise<Agreed<CheckpointError>>(
      "reading bucket ", head[0] + 1, " of ", plan_.buckets.size(),
      all_read_ ? " failed on rank " : " failed on reader rank ", rank,
      all_read_ ? " (--readers all: each rank reads its own slices)"
      : world_bucket
          ? " (--readers node, rotated broadcast roots: its turn to read a broadcast bucket for "
            "every rank)"
      : node_read_ ? " (--readers node: each node's reader reads for the ranks of its node)"
                   : "",
      ": ", message, applied,
      head[2] ? concat("; rank ", rank,
                       "'s own rows of this bucket may have changed too (it reads them straight "
                       "into its parameters)")
              : std::string());
}

}  // namespace tpreload::detail::pipeline_internal
