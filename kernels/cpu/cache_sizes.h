// The cache sizes the CPU kernels size their blocking by, read once: one core's L2, and the L3 that
// core shares with others (its own L3 slice, not the socket's sum).
#pragma once
#include <cstdint>

namespace multinorm::cpu {

// One core's L2 in bytes (1 MiB where nothing says).
int64_t l2_bytes();
// The L3 the first core sees, in bytes (0 where nothing says). From Linux's
// /sys/devices/system/cpu/cpu0/cache, else sysconf: glibc's _SC_LEVEL3_CACHE_SIZE reads 320 MiB on
// a 2-core AMD EPYC (Zen 4) VM whose cores share one 32 MiB L3, as its own sysfs and lscpu say.
int64_t l3_bytes();

}  // namespace multinorm::cpu
