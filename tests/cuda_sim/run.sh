#!/usr/bin/env bash
# tests/cuda_sim/run.sh — `make test-cuda-sim`: the CUDA backend's kernels, its
# streams and the NCCL communicator on the simulated device (tests/cuda_sim,
# docs/cuda.md "The simulated device"), under AddressSanitizer, no GPU needed:
#   1. configure $SIM_BUILD (default build-sim) with -DMPITRON_CUDA_SIM=ON,
#   2. build the tests below,
#   3. run them with device=cuda (MPITRON_TEST_DEVICE=cuda for the trainer tests),
#      asynchronous streams with the race check and the NCCL stand-in on,
#   4. print `kernel <name> launches <n>` per __global__ of tensor/cuda and
#      `nccl <call> calls <n>` per NCCL call, and fail if one never happened.
# SIM_TESTS (a ctest regex) narrows the run, e.g. SIM_TESTS=tensor_test_softmax.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
BUILD=${SIM_BUILD:-build-sim}
JOBS=${JOBS:-$(nproc)}
start=$(date +%s)
# The op conformance suite (device=cuda), the simulator's own tests (streams, race
# check, NCCL stand-in), the communicator's collectives through NCCL, the GPT
# reference against PyTorch, bitwise resume, and the TP/PP/DP equivalence at 2 and
# 4 ranks, GPT and BERT (bidirectional attention with padding masks, the MLM and
# sentence-order heads), their communicators through parallel/comm_nccl.cpp;
# context parallelism at 2 ranks (every comm type's attention, and the CP2 trainer's quick set);
# T5 against transformers on the device (cross-attention, the biased attention blocks, ReLU/GeGLU); the 2026
# families against transformers 4.57 (rope scaling, QK-norm, soft caps, windows per layer, sandwich/output norms).
# Every tests/tensor/test_*.cpp and tests/cuda_sim/test_*.cpp (new ones join by themselves), then the rest.
TESTS=($(for f in tests/tensor/test_*.cpp; do f=${f##*/}; echo "tensor_${f%.cpp}"; done)
       $(for f in tests/cuda_sim/test_*.cpp; do f=${f##*/}; echo "cuda_sim_${f%.cpp}"; done)
       parallel_test_comm parallel_test_zero parallel_test_expert_parallel model_test_gpt_reference model_test_trainer model_test_trainer_mp model_test_bert_train_mp
       parallel_test_context_parallel model_test_trainer_cp model_test_trainer_zero3 model_test_t5 model_test_families2_cuda)
REGEX=${SIM_TESTS:-'^(tensor_test_.*|cuda_sim_test_.*|parallel_test_(comm|zero|expert_parallel)_np2|model_test_gpt_reference|model_test_trainer_mp_np(2|4)|model_test_bert_train_mp_np2|parallel_test_context_parallel_np2|model_test_trainer_cp_np2|model_test_trainer_zero3_np2|model_test_t5|model_test_families2_cuda)$'}

[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -G Ninja -DMPITRON_CUDA_SIM=ON ${SIM_CMAKE_FLAGS:-}
cmake --build "$BUILD" -j "$JOBS" --target "${TESTS[@]}"

counts="$ROOT/$BUILD/cuda_sim_kernel_counts.txt"
rm -f "$counts"
# Leak checks are off: MPI and the process-lifetime caches hold memory at exit by design.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=0:detect_stack_use_after_return=0}
# At 2 ranks: PP2 zb-h1 (the p2p sends, split backward); at 4 ranks TP2 with sequence
# parallelism x DP2 with ZeRO-2 and --overlap-param-gather (the TP and DP collectives on
# sub-communicators; the 2-rank TP2+SP, PP2 1F1B and DP2 ZeRO-2 layouts add no kernel or
# NCCL call to these and stay in the CPU suite and gpu_check.sh, keeping CI under 40 minutes)
# (MPITRON_TEST_LAYOUTS[_NP4] pick them from tests/model/test_trainer_mp.cpp; all of
# them cost ~4x the time under the simulation). The 4-rank run is rank 0's
# single-process reference then that layout, 10 steps each (~5-6 s a step here,
# mostly the vocab-wide GEMMs and cross-entropy kernels): ~125 s on a quiet 2-core VM
# (the cross-layout checkpoint case, ~450 s more, stays out of the quick set).
# ZeRO-3 at 2 ranks: DP2 against the one-process run, 5 steps (tests/model/test_trainer_zero3.cpp's quick set).
# BERT at 2 ranks: PP2 zb-h1 (padded bidirectional attention, both heads, the tied
# decoder over stages, split backward; MPITRON_BERT_TEST_LAYOUTS, tests/model/test_bert_train_mp.cpp).
export MPITRON_CUDA_SIM_COUNTS="$counts" MPITRON_TEST_DEVICE=cuda MPITRON_TEST_LAYOUTS=${MPITRON_TEST_LAYOUTS:-6}
export MPITRON_TEST_LAYOUTS_NP4=${MPITRON_TEST_LAYOUTS_NP4:-11}
export MPITRON_BERT_TEST_LAYOUTS=${MPITRON_BERT_TEST_LAYOUTS:-3}
# The 2026 families on the device: one model per new kernel path (yarn rope; soft caps, windows per layer and
# sandwich norms; QK-norm with a local rope base and linear scaling; full-width QK-norm; partial rotary).
export MPITRON_FAMILIES2_CUDA=${MPITRON_FAMILIES2_CUDA:-llama3_yarn,gemma2,gemma3,olmo2,phi4_mini}
status=0
(cd "$BUILD" && ctest --output-on-failure -j "$JOBS" -R "$REGEX") || status=1
if [ -z "${SIM_TESTS:-}" ]; then
  # Bitwise resume on the device (the rest of model_test_trainer is CPU-only flag checks).
  (cd "$BUILD" && ./tests/model_test_trainer --test-case='resume*') || status=1
fi
echo "cuda-sim: tests done in $(( $(date +%s) - start )) s"
if [ -z "${SIM_TESTS:-}" ]; then
  tests/cuda_sim/kernel_report.sh "$counts" || status=1
fi
echo "cuda-sim: done in $(( $(date +%s) - start )) s"
exit $status
