#include "core/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "schemas/tensorboard.pb.h"

namespace troupe {
namespace {

// Byte-at-a-time table of the reflected Castagnoli polynomial.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return t;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back((char)((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& payload) {
  std::string out;
  put_le(out, payload.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out += payload;
  put_le(out, masked_crc32c(payload.data(), payload.size()), 4);
  return out;
}

std::vector<std::string> read_tfrecords(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read the event file " + path);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::vector<std::string> out;
  size_t off = 0;
  while (off < bytes.size()) {
    auto bad = [&](const std::string& what) {
      return Error(path + ": record at byte " + std::to_string(off) + ": " + what);
    };
    if (bytes.size() - off < 12) throw bad("truncated header");
    const uint64_t len = get_le(p + off, 8);
    if (get_le(p + off + 8, 4) != masked_crc32c(p + off, 8)) throw bad("length CRC mismatch");
    if (bytes.size() - off - 12 < len + 4) throw bad("truncated data");
    if (get_le(p + off + 12 + len, 4) != masked_crc32c(p + off + 12, len)) throw bad("data CRC mismatch");
    out.emplace_back(bytes.data() + off + 12, len);
    off += 12 + len + 4;
  }
  return out;
}

void create_event_dir(const std::string& dir) {
  std::error_code ec;
  const std::string link = broken_link_on(dir);
  TROUPE_USER_CHECK(link.empty()) << "cannot create the TensorBoard directory " << dir << ": " << link
                                  << " try again, or pass another --tensorboard DIR";
  std::filesystem::create_directories(dir, ec);
  TROUPE_USER_CHECK(!ec && std::filesystem::is_directory(dir))
      << "cannot create the TensorBoard directory " << dir << " (" << ec.message()
      << "); pass a writable --tensorboard DIR";
}

EventWriter::EventWriter(const std::string& dir) {
  create_event_dir(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  path_ = dir + "/events.out.tfevents." + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()) +
          "." + host + "." + std::to_string(::getpid()) + ".troupe";
  const int err = file_.open(path_);
  TROUPE_USER_CHECK(err == 0) << "cannot write the TensorBoard event file " << path_ << " (" << std::strerror(err)
                                   << "); pass a writable --tensorboard DIR";
  tensorboard::Event ev;
  ev.set_wall_time(std::chrono::duration<double>(now).count());
  ev.set_file_version("brain.Event:2");
  write_record(ev.SerializeAsString());
}

EventWriter::~EventWriter() = default;

void EventWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars,
                              double wall_time) {
  tensorboard::Event ev;
  ev.set_wall_time(wall_time);
  ev.set_step(step);
  auto* summary = ev.mutable_summary();
  for (auto& [tag, v] : scalars) {
    auto* val = summary->add_value();
    val->set_tag(tag);
    val->set_simple_value((float)v);
  }
  write_record(ev.SerializeAsString());
}

void EventWriter::write_record(const std::string& payload) {
  if (const int err = file_.append(tfrecord_frame(payload)); err != 0)
    throw Error("cannot write the TensorBoard event file " + path_ + ": " + std::strerror(err));
}

}  // namespace troupe
