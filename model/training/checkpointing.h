// model/training/checkpointing.h — the name this header had before the checkpoint layer:
// model/checkpoint/checkpointing.h (the format, under any layout) and
// model/training/adamw_checkpoint.h (a whole ReplicatedOptimizer).
#pragma once
#include "model/checkpoint/checkpointing.h"
#include "model/training/adamw_checkpoint.h"
