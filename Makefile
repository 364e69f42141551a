# Thin wrapper over meson. The two commands of the README's quick start:
#   make run   install what is missing, build, start msmoed on the embedded model, show a reply
#   make test  install what is missing, build, run every test (unit, integration, the ASan+UBSan
#              pass of the unit and integration tests, the ThreadSanitizer pass of the daemon, and
#              each libFuzzer target for a bounded time), and compile the release configuration too
# Every build here passes -Dwerror=true: meson.build defaults to werror=false for users, and CI
# (`make test`) must still fail on any new warning, -O3-only ones included (build-release).
export PATH := /usr/local/cuda/bin:$(PATH)
BUILD ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
RELEASE_BUILD ?= build-release
MESON_ARGS ?= -Dwerror=true

.PHONY: all deps build build-release run test test-asan test-tsan clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_ARGS)

build: deps $(BUILD)/build.ninja
	@scripts/drop-stale-cuda-objects $(BUILD)
	ninja -C $(BUILD)

run: build
	@scripts/run-demo $(BUILD)

test: build
	meson test -C $(BUILD) --print-errorlogs --num-processes 2
	$(MAKE) build-release
	$(MAKE) test-asan
	$(MAKE) test-tsan
	$(MAKE) test-fuzz FUZZ_TIME=10

# The release configuration (-O3, what the GPU bundles use), compiled only: warnings that only
# -O3 shows must not come back.
build-release: deps
	@[ -f $(RELEASE_BUILD)/build.ninja ] || meson setup $(RELEASE_BUILD) -Dbuildtype=release \
		-Dfuzz=disabled -Dwerror=true
	@scripts/drop-stale-cuda-objects $(RELEASE_BUILD)
	ninja -C $(RELEASE_BUILD)

# Unit and integration tests again under AddressSanitizer + UndefinedBehaviorSanitizer (host code;
# CUDA off). The integration suites start this build's msmoed, so a leak or an error in the daemon
# fails its test (LeakSanitizer at exit turns a clean exit 0 into a failure).
test-asan: deps
	@[ -f $(ASAN_BUILD)/build.ninja ] || meson setup $(ASAN_BUILD) -Dcuda=disabled -Dfuzz=disabled \
		-Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Dwerror=true
	ninja -C $(ASAN_BUILD)
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
		LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
		meson test -C $(ASAN_BUILD) --suite unit --suite integration --print-errorlogs --num-processes 2

# ThreadSanitizer: msmoed, msmoe-run and msmoe built with -fsanitize=thread (CUDA off), driven by
# the daemon integration suites of $(BUILD) (Criterion itself cannot run under TSan: its
# inheritable arena fails to map, Criterion issue #274, so the test programs stay uninstrumented).
# The daemon's threads: the loop, a scheduler per group, rank threads and their aux workers, the
# host collectives (TP=2 x 2 replicas in daemon_groups), libuv's pool for tokenization. Any report
# fails the target. (The timing test of the tokenization worker is left out: TSan slows the
# tokenizer 15-fold.)
TSAN_SUITES := daemon_groups daemon_lifecycle daemon_hardening daemon daemon_text
test-tsan: build
	@[ -f $(TSAN_BUILD)/build.ninja ] || meson setup $(TSAN_BUILD) -Dcuda=disabled -Dfuzz=disabled \
		-Db_sanitize=thread -Db_lundef=false -Dwerror=true
	ninja -C $(TSAN_BUILD) daemon/msmoed tools/msmoe-run tools/msmoe
	rm -rf $(TSAN_BUILD)/reports && mkdir -p $(TSAN_BUILD)/reports
	@set -e; for s in $(TSAN_SUITES); do echo "ThreadSanitizer: $$s"; \
		TSAN_OPTIONS=log_path=$(CURDIR)/$(TSAN_BUILD)/reports/tsan MSMOED=$(CURDIR)/$(TSAN_BUILD)/daemon/msmoed \
		MSMOE_RUN=$(CURDIR)/$(TSAN_BUILD)/tools/msmoe-run MSMOE=$(CURDIR)/$(TSAN_BUILD)/tools/msmoe \
		MSMOE_MODEL=$(CURDIR)/models/stories260k-moe \
		$(BUILD)/tests/integration/test_$$s --jobs 2 --filter '!(*tokenization_does_not_stall*)'; done
	@if ls $(TSAN_BUILD)/reports/tsan.* >/dev/null 2>&1; then cat $(TSAN_BUILD)/reports/tsan.*; \
		echo "ThreadSanitizer reported the races above"; exit 1; fi

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(RELEASE_BUILD) $(FUZZ_BUILD)

# libFuzzer targets (tests/fuzz) under ASan + UBSan, built with clang in their own build dir,
# each run for FUZZ_TIME seconds from its committed seed corpus (tests/fuzz/corpus/<name>/).
# New inputs libFuzzer finds go to $(FUZZ_BUILD)/corpus/<name>/, never into the source tree.
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 20
FUZZ_TARGETS := $(notdir $(wildcard tests/fuzz/corpus/*))

.PHONY: test-fuzz
test-fuzz: deps
	@[ -f $(FUZZ_BUILD)/build.ninja ] || CC=clang meson setup $(FUZZ_BUILD) -Dcuda=disabled \
		-Dfuzz=enabled -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=true
	ninja -C $(FUZZ_BUILD) $(addprefix tests/fuzz/fuzz_,$(FUZZ_TARGETS))
	@set -e; for t in $(FUZZ_TARGETS); do \
		mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
		dict=""; [ -f tests/fuzz/$$t.dict ] && dict="-dict=tests/fuzz/$$t.dict"; \
		echo "fuzz_$$t: $(FUZZ_TIME)s"; \
		UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
			$(FUZZ_BUILD)/tests/fuzz/fuzz_$$t -max_total_time=$(FUZZ_TIME) -print_final_stats=1 \
			-artifact_prefix=$(FUZZ_BUILD)/fuzz_$$t- $$dict \
			$(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t; \
	done
