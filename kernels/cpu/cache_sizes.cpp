#include "cache_sizes.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace multinorm::cpu {

namespace {
// The size of cpu0's unified or data cache of `level` from sysfs ("32768K"), or 0.
int64_t sysfs_cache_bytes(int level) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int l = 0;
    std::string type, size;
    if (!(level_file >> l) || !(type_file >> type) || !(size_file >> size)) break;
    if (l != level || type == "Instruction") continue;
    int64_t bytes = 0;
    size_t k = 0;
    for (; k < size.size() && size[k] >= '0' && size[k] <= '9'; ++k) bytes = bytes * 10 + (size[k] - '0');
    if (k < size.size()) {
      if (size[k] == 'K') bytes <<= 10;
      else if (size[k] == 'M') bytes <<= 20;
      else if (size[k] == 'G') bytes <<= 30;
    }
    return bytes;
  }
  return 0;
}

int64_t cache_bytes(int level, int sysconf_name, int64_t fallback) {
  if (const int64_t b = sysfs_cache_bytes(level); b > 0) return b;
  const long b = sysconf(sysconf_name);
  return b > 0 ? static_cast<int64_t>(b) : fallback;
}
}  // namespace

int64_t l2_bytes() {
  static const int64_t l2 = cache_bytes(2, _SC_LEVEL2_CACHE_SIZE, int64_t{1} << 20);
  return l2;
}

int64_t l3_bytes() {
  static const int64_t l3 = cache_bytes(3, _SC_LEVEL3_CACHE_SIZE, 0);
  return l3;
}

}  // namespace multinorm::cpu
