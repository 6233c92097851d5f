# troupe — the README's commands. Each target installs what is missing first.
BUILD ?= build
CONFIG ?= configs/sotu.toml
JOBS ?= $(shell nproc)

.PHONY: setup build data data-blend train test bench clean

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

data: build
	bash scripts/get-corpus.sh data/sotu.txt
	$(BUILD)/troupe prepare --config $(CONFIG)

data-blend: build
	bash scripts/get-sources.sh
	$(BUILD)/troupe prepare --config configs/blend.toml --report data/blend-report.json

train: data
	$(BUILD)/troupe train --config $(CONFIG)

test: build
	BUILD=$(BUILD) JOBS=$(JOBS) bash scripts/test.sh

bench: data
	@bash scripts/setup.sh --reference
	bash bench/run.sh

clean:
	rm -rf $(BUILD)
