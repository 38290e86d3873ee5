// model/inference/runner_flags.h — the inference tools' flags (model/flags/inference_flags.h)
// applied to the model runner (model/inference/model_runner.h): its layout, dtype and
// device, the size of its paged KV pool, and the dynamic engine's configuration.
#pragma once
#include <cstdint>

#include "model/flags/inference_flags.h"
#include "model/inference/dynamic_engine.h"
#include "model/inference/model_runner.h"

namespace mpitron {

// --tensor-model-parallel-size, --pipeline-model-parallel-size, --fp16/--bf16, --device,
// --force-mpi-for-device.
RunnerOptions runner_options(const InferenceFlags& f);

// Blocks of the KV pool on every rank for the runner's model and these flags
// (the same number on every rank). Throws naming the flag when
// --inference-dynamic-batching-buffer-size-gb cannot hold one whole sequence.
int64_t kv_cache_blocks(const DynamicBatchingFlags& b, const ModelRunner& runner, int64_t max_requests);

// The engine's limits, chunked prefill, speculative decoding and prefix caching from the flags.
EngineConfig engine_config(const DynamicBatchingFlags& b, int64_t max_requests);

}  // namespace mpitron
