# Thin wrapper over CMake. `make` builds with every core, `make test` runs ctest.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build configure test deps demo clean bench

all: build

deps:
	./scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	./scripts/install-cudnn-frontend.sh
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Train a small GPT on the bundled tiny Shakespeare and show the loss falling.
demo:
	./scripts/demo.sh

bench: build
	$(BUILD)/bench/bench_ops

clean:
	rm -rf $(BUILD)
