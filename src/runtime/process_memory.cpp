#include "multinorm/process_memory.h"

#include <unistd.h>

#include <cstdio>

namespace multinorm {

ProcessMemory process_memory() {
  // statm: size resident shared text lib data dt, in pages; "shared" is the resident file-backed
  // and shared-memory pages (RssFile + RssShmem of /proc/self/status).
  long size = 0, resident = 0, shared = 0;
  ProcessMemory m;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld %ld", &size, &resident, &shared) == 3) {
      const int64_t page = ::sysconf(_SC_PAGESIZE);
      m.resident_bytes = resident * page;
      m.file_backed_bytes = shared * page;
    }
    std::fclose(f);
  }
  return m;
}

}  // namespace multinorm
