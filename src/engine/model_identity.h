// The identity of a model's KV bytes, for keys in a store shared between processes (kv/shared_tier.h).
//
// Two processes may exchange a KV page only if they would have computed the same bytes: same weights
// and hyper-parameters (the model file, hashed whole: a GGUF's metadata and tensors; a llama2.c
// checkpoint), same KV layout (element type, page size, head dim, the page record format) and the
// same kernel paths (matmul and attention: the AVX-512 and AVX2 kernels round differently, so KV from
// one would make a replica's greedy output differ from its own recompute). The context length is not
// part of it: it changes no page's bytes.
//
// Cost: one sequential read of the model file (XXH3 runs at memory speed; the file is usually in the
// page cache already), done once at start-up and only when a shared tier is configured.
#pragma once
#include <cstdint>
#include <string>

#include "kv/page_pool.h"
#include "model/model.h"

namespace kvpack {

// Throws std::runtime_error when the model file cannot be read.
uint64_t model_kv_identity(const Model& model, const kv::PoolConfig& pool);
// "xxxxxxxxxxxxxxxx" (16 hex digits), as in the shared tier's key names.
std::string identity_hex(uint64_t id);

}  // namespace kvpack
