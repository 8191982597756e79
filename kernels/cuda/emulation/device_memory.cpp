// The emulated device's memory: a guarded page allocator over one reserved range, and the write
// journal (device_memory.h).
#include "device_memory.h"

#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace cuda_emu {
namespace device {
namespace {

constexpr size_t kPage = 4096;

size_t total_ram() {
  struct sysinfo si {};
  ::sysinfo(&si);
  return static_cast<size_t>(si.totalram) * si.mem_unit;
}

struct Allocation {
  size_t first_page, pages;  // the run, guards included
  size_t bytes;
};

// Page states of the journal: 0 untouched, 1 being saved, 2 saved.
class Arena {
 public:
  Arena() {
    capacity_ = total_ram();
    // Address space only (no memory): room for the whole RAM in allocations plus their guard pages.
    reserved_pages_ = 2 * capacity_ / kPage + (size_t(1) << 20);
    void* p = ::mmap(nullptr, reserved_pages_ * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "emulated CUDA: cannot reserve the device's address range\n");
      std::abort();
    }
    base_ = static_cast<char*>(p);
    void* s = ::mmap(nullptr, reserved_pages_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) std::abort();
    state_ = static_cast<std::atomic<uint8_t>*>(s);
    free_[0] = reserved_pages_;
  }

  void* allocate(size_t bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    const size_t data_pages = (rounded + kPage - 1) / kPage, run = data_pages + 2;
    std::lock_guard<std::mutex> lock(mu_);
    if (rounded > capacity_ - std::min(capacity_, in_use_)) return nullptr;
    auto it = free_.begin();
    while (it != free_.end() && it->second < run) ++it;
    if (it == free_.end()) return nullptr;
    const size_t first = it->first;
    if (it->second > run) free_[first + run] = it->second - run;
    free_.erase(it);
    char* data_begin = base_ + (first + 1) * kPage;
    if (::mprotect(data_begin, data_pages * kPage, PROT_READ | PROT_WRITE) != 0) {
      release_run(first, run);
      return nullptr;
    }
    // Large allocations on transparent huge pages where the kernel offers them: a gigabyte poisoned
    // through 4 KB page faults costs seconds.
    if (data_pages * kPage >= (size_t(4) << 20)) ::madvise(data_begin, data_pages * kPage, MADV_HUGEPAGE);
    char* p = data_begin + data_pages * kPage - rounded;  // the end against the upper guard page
    std::memset(p, 0xff, rounded);
    live_[p] = Allocation{first, run, rounded};
    in_use_ += rounded;
    return p;
  }

  bool release(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(static_cast<char*>(p));
    if (it == live_.end()) return false;
    const Allocation a = it->second;
    char* data_begin = base_ + (a.first_page + 1) * kPage;
    ::madvise(data_begin, (a.pages - 2) * kPage, MADV_DONTNEED);
    ::mprotect(data_begin, (a.pages - 2) * kPage, PROT_NONE);
    in_use_ -= a.bytes;
    live_.erase(it);
    release_run(a.first_page, a.pages);
    return true;
  }

  bool contains(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    return find(static_cast<const char*>(p), bytes) != live_.end();
  }
  // The live allocation holding [c, c + bytes), or end().
  std::map<char*, Allocation>::iterator find(const char* c, size_t bytes) {  // mu_ held
    auto it = live_.upper_bound(const_cast<char*>(c));
    if (it == live_.begin()) return live_.end();
    --it;
    return c >= it->first && c + bytes <= it->first + it->second.bytes ? it : live_.end();
  }
  // "" when p is outside the reserved range; else what it is there.
  std::string describe(const void* p) {
    const char* c = static_cast<const char*>(p);
    if (c < base_ || c >= base_ + reserved_pages_ * kPage) return "";
    std::lock_guard<std::mutex> lock(mu_);
    auto it = find(c, 0);
    char buf[160];
    if (it == live_.end())
      std::snprintf(buf, sizeof buf, "in the emulated device's address range but in no live allocation (freed, or a guard page)");
    else
      std::snprintf(buf, sizeof buf, "device allocation %p of %zu bytes, byte %zu", static_cast<void*>(it->first), it->second.bytes,
                    static_cast<size_t>(c - it->first));
    return buf;
  }
  const char* base() const { return base_; }
  size_t reserved_bytes() const { return reserved_pages_ * kPage; }

  std::vector<std::pair<char*, size_t>> allocations() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<char*, size_t>> v;
    for (const auto& [p, a] : live_) v.emplace_back(p, a.bytes);
    return v;
  }

  size_t in_use() {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }
  size_t capacity() const { return capacity_; }

  // ---- journal ----
  void journal_begin() {
    journal_.pages.clear();
    journaling_.store(true, std::memory_order_release);
  }
  Journal journal_end() {
    journaling_.store(false, std::memory_order_release);
    for (auto& [page, contents] : journal_.pages) state_[(page - base_) / kPage].store(0, std::memory_order_relaxed);
    Journal j;
    std::swap(j, journal_);
    return j;
  }
  void note_write(const void* p, size_t bytes) {
    if (!journaling_.load(std::memory_order_relaxed)) return;
    const char* c = static_cast<const char*>(p);
    if (c < base_ || c >= base_ + reserved_pages_ * kPage || bytes == 0) return;
    const size_t first = (c - base_) / kPage, last = std::min((c + bytes - 1 - base_) / kPage, reserved_pages_ - 1);
    for (size_t page = first; page <= last; ++page) {
      std::atomic<uint8_t>& s = state_[page];
      if (s.load(std::memory_order_acquire) == 2) continue;
      uint8_t expected = 0;
      if (s.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
        char* at = base_ + page * kPage;
        std::vector<char> original(at, at + kPage);  // saved before any store reaches the page
        {
          std::lock_guard<std::mutex> lock(journal_mu_);
          journal_.pages.emplace_back(at, std::move(original));
        }
        s.store(2, std::memory_order_release);
      } else {
        while (s.load(std::memory_order_acquire) != 2) std::this_thread::yield();  // another worker is saving it
      }
    }
  }

 private:
  void release_run(size_t first, size_t pages) {  // mu_ held
    auto next = free_.lower_bound(first);
    if (next != free_.end() && next->first == first + pages) {
      pages += next->second;
      free_.erase(next);
    }
    auto prev = free_.lower_bound(first);
    if (prev != free_.begin()) {
      --prev;
      if (prev->first + prev->second == first) {
        prev->second += pages;
        return;
      }
    }
    free_[first] = pages;
  }

  char* base_ = nullptr;
  size_t reserved_pages_ = 0, capacity_ = 0, in_use_ = 0;
  std::mutex mu_;
  std::map<size_t, size_t> free_;    // first page -> pages
  std::map<char*, Allocation> live_;  // base -> allocation
  std::atomic<uint8_t>* state_ = nullptr;
  std::atomic<bool> journaling_{false};
  std::mutex journal_mu_;
  Journal journal_;
};

Arena& arena() {
  static Arena* a = new Arena;  // never destroyed: kernels of a late launch may still note writes
  return *a;
}

// Pinned host allocations: start -> bytes (greatest start first, so lower_bound finds the last start
// at or below an address).
struct Pinned {
  std::mutex mu;
  std::map<const char*, size_t, std::greater<const char*>> ranges;
};
Pinned& pinned() {
  static Pinned* p = new Pinned;  // never destroyed, as the arena
  return *p;
}

}  // namespace

void* allocate(size_t bytes) { return arena().allocate(bytes); }
bool release(void* p) { return arena().release(p); }
bool contains(const void* p, size_t bytes) { return arena().contains(p, bytes); }
size_t bytes_in_use() { return arena().in_use(); }
size_t capacity() { return arena().capacity(); }
void journal_begin() { arena().journal_begin(); }
Journal journal_end() { return arena().journal_end(); }
void note_write(const void* p, size_t bytes) { arena().note_write(p, bytes); }
void range(const char** begin, size_t* bytes) {
  *begin = arena().base();
  *bytes = arena().reserved_bytes();
}

void add_pinned(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(pinned().mu);
  pinned().ranges[static_cast<const char*>(p)] = bytes;
}
void remove_pinned(const void* p) {
  std::lock_guard<std::mutex> lock(pinned().mu);
  pinned().ranges.erase(static_cast<const char*>(p));
}
bool is_pinned(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(pinned().mu);
  const char* c = static_cast<const char*>(p);
  auto it = pinned().ranges.lower_bound(c);
  return it != pinned().ranges.end() && c + bytes <= it->first + it->second;
}

std::string describe(const void* p) {
  if (!p) return "a null pointer";
  if (std::string d = arena().describe(p); !d.empty()) return d;
  if (is_pinned(p, 0)) return "pinned host memory";
  return "host memory (not a device allocation, not pinned)";
}

}  // namespace device

bool is_device_memory(const void* p, size_t bytes) { return device::contains(p, bytes); }
bool is_kernel_reachable(const void* p) { return !p || device::contains(p, 0) || device::is_pinned(p, 0); }

DeviceImage save_device_memory() {
  DeviceImage image;
  for (const auto& [base, bytes] : device::arena().allocations()) image.allocations.emplace_back(base, std::vector<char>(base, base + bytes));
  return image;
}

void restore_device_memory(const DeviceImage& image) {
  for (const auto& [base, contents] : image.allocations) std::memcpy(base, contents.data(), contents.size());
}

std::string compare_device_memory(const DeviceImage& image) {
  for (const auto& [base, contents] : image.allocations) {
    if (std::memcmp(base, contents.data(), contents.size()) == 0) continue;
    size_t i = 0;
    while (base[i] == contents[i]) ++i;
    char buf[200];
    std::snprintf(buf, sizeof buf, "device memory at %p, byte %zu of a %zu-byte range (4-byte word %zu): 0x%02x, then 0x%02x",
                  static_cast<void*>(base + i), i, contents.size(), i / 4, static_cast<unsigned char>(contents[i]),
                  static_cast<unsigned char>(base[i]));
    return buf;
  }
  return "";
}

}  // namespace cuda_emu
