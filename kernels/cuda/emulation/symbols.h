// Names for what the emulated build runs, read from the ELF symbol tables of the loaded modules
// (.symtab, which holds the anonymous-namespace kernels and the function-local `static thread_local`
// variables that __shared__ becomes; dladdr sees only exported symbols). Used to name a kernel in a
// launch-limit error and to look up its ptxas figures, and to name the __shared__ array a race or an
// uninitialised read touched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace cuda_emu::symbols {

// The demangled signature of the function at `fn`, e.g. "void multinorm::cuda::(anonymous
// namespace)::rope_kernel<__nv_bfloat16>(__nv_bfloat16*, ...)"; "" when no symbol covers it.
std::string function_name(const void* fn);

// A thread-local variable of the module containing `code` (an address in that module's code), found
// by its offset in the module's TLS segment: "name + byte" ("" when none covers it).
std::string tls_variable(const void* code, size_t tls_offset);

// The calling thread's TLS block of the module containing `code`: [*begin, *begin + *bytes).
// False when the module has no TLS segment or this thread's block is not allocated yet.
bool tls_block(const void* code, char** begin, size_t* bytes);

// cxxabi's demangler; `mangled` itself when it is not a mangled C++ name.
std::string demangle(const char* mangled);

}  // namespace cuda_emu::symbols
