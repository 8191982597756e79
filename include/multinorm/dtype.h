// Element types of stored tensors. Compute is always FP32 (or FP64 in reference paths).
#pragma once
#include <cstdint>
#include <string>

namespace multinorm {

// F64 is not a storage type: only the update's statistics travel in it (Communicator sums).
enum class DType : uint8_t { F32, BF16, F64 };

inline int64_t dtype_bytes(DType t) { return t == DType::F32 ? 4 : t == DType::BF16 ? 2 : 8; }
inline const char* dtype_name(DType t) { return t == DType::F32 ? "fp32" : t == DType::BF16 ? "bf16" : "fp64"; }
DType parse_dtype(const std::string& name);  // "fp32" | "bf16"; throws ConfigError otherwise

}  // namespace multinorm
