// This process's resident memory, as the kernel counts it (/proc/self/statm).
#pragma once

#include <cstdint>

namespace multinorm {

struct ProcessMemory {
  int64_t resident_bytes = 0;  // every resident page: RSS
  // Resident pages backed by files or shared memory: the binary, its libraries and memory-mapped
  // token shards. The kernel can drop and reload them; they grow as a run reads more of its data.
  int64_t file_backed_bytes = 0;
  // What the process itself allocated (weights, states, activations, heap): RSS less the file pages.
  int64_t anonymous_bytes() const { return resident_bytes - file_backed_bytes; }
};

// Zeros when /proc is not there.
ProcessMemory process_memory();

}  // namespace multinorm
