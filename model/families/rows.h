// model/families/rows.h — every family's row (one file each under model/families/), in the order
// model/families/registry.cpp lists them. A new family: its file, a line here and a line there.
#pragma once
#include "model/families.h"

namespace mpitron {

Family bert_family();
Family t5_family();
Family gpt2_family();
Family llama_family();
Family qwen2_family();
Family mistral_family();
Family gemma_family();
Family mixtral_family();
Family qwen2_moe_family();
Family qwen3_family();
Family qwen3_moe_family();
Family gemma2_family();
Family gemma3_family();
Family olmo2_family();
Family phi3_family();
Family deepseek_v3_family();

}  // namespace mpitron
