# Thin wrapper over CMake. `make` builds with every core, `make test` runs ctest.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# ccache keys on paths relative to the checkout, so a second clone (CI's) reuses
# what an earlier build of the same sources compiled.
export CCACHE_BASEDIR ?= $(CURDIR)

.PHONY: all build configure test test-all test-cuda-sim deps demo clean bench

all: build

deps:
	./scripts/install-deps.sh

# Configured means build.ninja exists (CMake writes it last). The tools are checked
# first, naming what is missing and `make deps`; a CMake that fails (a library not
# found) leaves no half-made CMakeCache.txt, so the next `make` configures again
# instead of stopping at "ninja: error: loading 'build.ninja'".
CUDNN_FRONTEND ?= ./scripts/install-cudnn-frontend.sh
$(BUILD)/build.ninja:
	@./scripts/check-build-tools.sh
	$(CUDNN_FRONTEND)
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) || { rm -f $(BUILD)/CMakeCache.txt; \
	  echo "mpitron: configuring $(BUILD) failed (CMake's message above names what it did not find)." >&2; \
	  echo "run \`make deps\` to install mpitron's dependencies, then \`make\` again" >&2; exit 1; }

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# `make test` (the README's command, CI's) leaves out the tests labelled long (layout matrices
# whose smaller worlds cover the same code, the HF-reference sweeps of the older families:
# tests/CMakeLists.txt); `make test-all` runs every test, as gpu_check.sh does.
test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE long

test-all: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Every CUDA kernel on the simulated device (build-sim/, AddressSanitizer, no GPU):
# docs/cuda.md "The simulated device".
test-cuda-sim: deps
	./tests/cuda_sim/run.sh

# Train a small GPT on the bundled tiny Shakespeare and show the loss falling.
demo:
	./scripts/demo.sh

bench: build
	$(BUILD)/bench/bench_ops

clean:
	rm -rf $(BUILD)
