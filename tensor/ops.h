// tensor/ops.h — every op family (include this to get them all).
#pragma once
#include "tensor/adamw.h"
#include "tensor/attention.h"
#include "tensor/cross_entropy.h"
#include "tensor/dropout.h"
#include "tensor/elementwise.h"
#include "tensor/embedding.h"
#include "tensor/gelu.h"
#include "tensor/gemm.h"
#include "tensor/layernorm.h"
#include "tensor/norm.h"
#include "tensor/softmax.h"
#include "tensor/tensor.h"
