// checkpoint/snapshot_format.h — the bytes of a snapshot on disk (checkpoint/snapshot.h),
// shared by its writer (snapshot_write.cpp) and its reader (snapshot.cpp). Internal to
// checkpoint/: nothing outside it includes this.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/params.h"

namespace troupe::snapshot_format {

inline constexpr char kShardMagic[8] = {'T', 'R', 'P', 'S', 'H', 'R', 'D', '1'};
inline constexpr uint32_t kFormat = 1;
inline constexpr const char* kManifest = "manifest.capnp";
inline constexpr char kManifestTrailer[8] = {'T', 'R', 'P', 'M', 'A', 'N', 'I', '1'};  // + u32 crc32 of the message

// zlib's crc32 of the n bytes at p, continued from c (any n: zlib takes uInt lengths).
uint32_t crc(uint32_t c, const void* p, size_t n);
// strerror(errno), for a message naming a failed system call.
std::string errno_text();
// The manifest's name of a TP sharding ("replicated", "rows", ...).
const char* shard_kind_name(Shard s);

}  // namespace troupe::snapshot_format
