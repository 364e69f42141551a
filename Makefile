# Thin wrapper over meson. The two commands of the README's quick start:
#   make run   install what is missing, build, start msmoed on the embedded model, show a reply
#   make test  install what is missing, build, run every test (also the ASan+UBSan pass)
export PATH := /usr/local/cuda/bin:$(PATH)
BUILD ?= build
ASAN_BUILD ?= build-asan
MESON_ARGS ?=

.PHONY: all deps build run test test-asan clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_ARGS)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

run: build
	@scripts/run-demo $(BUILD)

test: build
	meson test -C $(BUILD) --print-errorlogs --num-processes 2
	$(MAKE) test-asan

# Unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer (host code; CUDA off).
test-asan: deps
	@[ -f $(ASAN_BUILD)/build.ninja ] || meson setup $(ASAN_BUILD) -Dcuda=disabled -Dfuzz=disabled \
		-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug
	ninja -C $(ASAN_BUILD)
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
		meson test -C $(ASAN_BUILD) --suite unit --print-errorlogs --num-processes 2

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
