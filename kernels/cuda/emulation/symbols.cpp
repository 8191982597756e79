// ELF symbol lookup for the emulated build (see symbols.h). A module's file is read once, on first
// use, into two sorted tables: functions by address offset, thread-locals by TLS offset.
#include "symbols.h"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace cuda_emu::symbols {
namespace {

struct Symbol {
  uint64_t value, size;
  std::string name;
};

struct ModuleTable {
  std::vector<Symbol> functions, tls;  // sorted by value
};

// Where an address lives: the module's file, load base, and its TLS segment (if any).
struct Module {
  std::string path;
  uintptr_t base = 0;
  size_t tls_bytes = 0;
  void* tls_data = nullptr;  // the calling thread's block
  bool found = false;
};

Module find_module(const void* addr) {
  struct Query {
    uintptr_t addr;
    Module m;
  } q{reinterpret_cast<uintptr_t>(addr), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto& q = *static_cast<Query*>(data);
        bool inside = false;
        size_t tls = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && q.addr >= lo && q.addr < lo + ph.p_memsz) inside = true;
          if (ph.p_type == PT_TLS) tls = ph.p_memsz;
        }
        if (!inside) return 0;
        q.m.found = true;
        q.m.path = info->dlpi_name && *info->dlpi_name ? info->dlpi_name : "/proc/self/exe";
        q.m.base = info->dlpi_addr;
        q.m.tls_bytes = tls;
        q.m.tls_data = info->dlpi_tls_data;
        return 1;
      },
      &q);
  return q.m;
}

ModuleTable read_table(const std::string& path) {
  ModuleTable t;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return t;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(ElfW(Ehdr)))) {
    ::close(fd);
    return t;
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return t;
  const auto* file = static_cast<const char*>(map);
  const auto* eh = reinterpret_cast<const ElfW(Ehdr)*>(file);
  auto in_file = [&](uint64_t off, uint64_t len) { return off <= bytes && len <= bytes - off; };
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && in_file(eh->e_shoff, uint64_t(eh->e_shnum) * sizeof(ElfW(Shdr)))) {
    const auto* sh = reinterpret_cast<const ElfW(Shdr)*>(file + eh->e_shoff);
    // .symtab when the module is not stripped (it holds the local symbols), else .dynsym.
    const ElfW(Shdr)* symtab = nullptr;
    for (int pass = 0; pass < 2 && !symtab; ++pass)
      for (int i = 0; i < eh->e_shnum; ++i)
        if (sh[i].sh_type == (pass == 0 ? SHT_SYMTAB : SHT_DYNSYM)) symtab = &sh[i];
    if (symtab && symtab->sh_link < eh->e_shnum && in_file(symtab->sh_offset, symtab->sh_size)) {
      const ElfW(Shdr)& strtab = sh[symtab->sh_link];
      const auto* syms = reinterpret_cast<const ElfW(Sym)*>(file + symtab->sh_offset);
      const size_t count = symtab->sh_size / sizeof(ElfW(Sym));
      for (size_t i = 0; i < count; ++i) {
        const int type = ELF64_ST_TYPE(syms[i].st_info);
        if ((type != STT_FUNC && type != STT_TLS) || syms[i].st_name >= strtab.sh_size) continue;
        if (!in_file(strtab.sh_offset + syms[i].st_name, 1)) continue;
        Symbol s{syms[i].st_value, syms[i].st_size, file + strtab.sh_offset + syms[i].st_name};
        (type == STT_FUNC ? t.functions : t.tls).push_back(std::move(s));
      }
    }
  }
  ::munmap(map, bytes);
  for (auto* v : {&t.functions, &t.tls})
    std::sort(v->begin(), v->end(), [](const Symbol& a, const Symbol& b) { return a.value < b.value; });
  return t;
}

std::mutex g_mu;
const ModuleTable& table(const std::string& path) {
  static std::map<std::string, std::unique_ptr<ModuleTable>> tables;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = tables[path];
  if (!slot) slot = std::make_unique<ModuleTable>(read_table(path));
  return *slot;
}

// The symbol covering `value` (a zero-sized symbol covers its own address only).
const Symbol* covering(const std::vector<Symbol>& v, uint64_t value) {
  auto it = std::upper_bound(v.begin(), v.end(), value, [](uint64_t x, const Symbol& s) { return x < s.value; });
  if (it == v.begin()) return nullptr;
  --it;
  if (value == it->value || value < it->value + it->size) return &*it;
  return nullptr;
}

}  // namespace

std::string demangle(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || !d) return mangled;
  std::string s(d);
  std::free(d);
  return s;
}

std::string function_name(const void* fn) {
  const Module m = find_module(fn);
  if (!m.found) return "";
  const Symbol* s = covering(table(m.path).functions, reinterpret_cast<uintptr_t>(fn) - m.base);
  return s ? demangle(s->name.c_str()) : "";
}

std::string tls_variable(const void* code, size_t tls_offset) {
  const Module m = find_module(code);
  if (!m.found) return "";
  const Symbol* s = covering(table(m.path).tls, tls_offset);
  if (!s) return "";
  return demangle(s->name.c_str()) + " + " + std::to_string(tls_offset - s->value);
}

bool tls_block(const void* code, char** begin, size_t* bytes) {
  const Module m = find_module(code);
  if (!m.found || m.tls_bytes == 0 || !m.tls_data) return false;
  *begin = static_cast<char*>(m.tls_data);
  *bytes = m.tls_bytes;
  return true;
}

}  // namespace cuda_emu::symbols
