// core/tensorboard.h — TensorBoard event files (scalars), written in TensorBoard's own
// format so that `tensorboard --logdir DIR` reads them:
//   - the container is TFRecord (tensorflow/core/lib/io/record_writer.cc): each record is
//       uint64 length (little-endian) | uint32 masked_crc32c(length bytes)
//       | length bytes of data | uint32 masked_crc32c(data)
//     where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (TensorFlow's
//     crc32c::Mask) and crc32c is CRC-32C (Castagnoli, reflected polynomial 0x82f63b78);
//   - each record holds one `Event` protobuf (schemas/tensorboard.proto, TensorBoard's field
//     numbers): the first has file_version "brain.Event:2", the others a `Summary` of
//     scalars (simple_value) at a step.
// Files are named events.out.tfevents.<unix seconds>.<host>.<pid>.troupe (TensorBoard reads
// every file whose name contains "tfevents").
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/append_file.h"

namespace troupe {

// CRC-32C (Castagnoli) of n bytes, continuing from `crc` (0 to start). crc32c("123456789") = 0xe3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TensorFlow's masked CRC-32C of n bytes (what TFRecord stores).
uint32_t masked_crc32c(const void* data, size_t n);
// One TFRecord: the framing above around `payload`.
std::string tfrecord_frame(const std::string& payload);
// The payloads of every record of a TFRecord file, in order. Throws Error naming the file
// and byte offset of a truncated record or a CRC mismatch.
std::vector<std::string> read_tfrecords(const std::string& path);

// Creates `dir` and its parents if needed. Throws UserError naming --tensorboard when it cannot.
void create_event_dir(const std::string& dir);

// Appends scalar events to a new event file in a directory.
class EventWriter {
 public:
  // Creates `dir` (create_event_dir), opens a new event file there and writes the
  // file_version record. Throws UserError when the directory or file cannot be written.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // Writes one Event at `step` holding every (tag, value) as a scalar (float, as TensorBoard
  // stores scalars), stamped `wall_time` (unix seconds), and flushes it to the file.
  // Throws Error when the write fails (a full disk); the file is then cut back to its last
  // whole event, so later events can still be appended and read.
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars, double wall_time);
  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::string path_;
  AppendFile file_;
};

}  // namespace troupe
