// Element types of stored tensors. Compute is always FP32 (or FP64 in reference paths).
#pragma once
#include <cstdint>
#include <string>

namespace multinorm {

enum class DType : uint8_t { F32, BF16 };

inline int64_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }
DType parse_dtype(const std::string& name);  // "fp32" | "bf16"; throws ConfigError otherwise

}  // namespace multinorm
