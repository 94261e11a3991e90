# fluxon-nats -- build, test, run, bench.
#
#   make          build the libraries, tools and test programs
#   make test     install missing packages, build, run every test (unit, integration, e2e)
#   make check    the same tests under ASan+UBSan (separate build dir)
#   make tsan     unit and integration tests under ThreadSanitizer
#   make valgrind unit tests under valgrind (leak check)
#   make run      install, build, start a local etcd + nats-server, run the bridge
#   make bench    benchmarks (tables into BENCHMARKS.md)
#   make soak     5-minute bridge memory soak under full load (nats_bench -S 300)
#   make fuzz     libFuzzer targets (tests/fuzz/, clang, ASan+UBSan, build dir build-fuzz), each
#                 run for FUZZ_SECONDS (default 30) from its seed corpus; non-zero on any crash
#   make fuzz-corpus  rewrite the seed corpora tests/fuzz/corpus/ (after a format change)
#   make clean

CC      ?= cc
BUILD   ?= build
SAN     ?=
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wstrict-prototypes -Wwrite-strings -Wshadow -Wno-missing-field-initializers
OPT     ?= -O2 -g
CFLAGS  += $(CSTD) $(WARN) $(OPT) -pthread -MMD -MP -I. -Ilease -Ibridge -Iplugin
LDLIBS  += -lcurl -lcjson -lhiredis -lpthread -lm
PLUGIN_LDLIBS := -lnats -lmicrohttpd -lcrypto

ifeq ($(SAN),address)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(SAN),fuzzer)
CFLAGS  += -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(SAN),thread)
CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer
LDFLAGS += -fsanitize=thread
endif

LEASE_SRC  := $(wildcard lease/*.c)
BRIDGE_SRC := $(wildcard bridge/*.c)
PLUGIN_MAIN:= plugin/main.c plugin/fluxonctl.c
PLUGIN_SRC := $(filter-out $(PLUGIN_MAIN),$(wildcard plugin/*.c))
SUPPORT_SRC:= $(wildcard tests/support/*.c)
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
INTEG_SRC  := $(wildcard tests/integration/test_*.c)
BENCH_SRC  := $(wildcard tests/bench/*.c)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_SECONDS ?= 30

LEASE_OBJ  := $(LEASE_SRC:%.c=$(BUILD)/%.o)
BRIDGE_OBJ := $(BRIDGE_SRC:%.c=$(BUILD)/%.o)
PLUGIN_OBJ := $(PLUGIN_SRC:%.c=$(BUILD)/%.o)
SUPPORT_OBJ:= $(SUPPORT_SRC:%.c=$(BUILD)/%.o)

LIBLEASE   := $(BUILD)/libfxlease.a
LIBBRIDGE  := $(BUILD)/libfxbridge.a
LIBPLUGIN  := $(BUILD)/libfxplugin.a
BINS       := $(if $(wildcard plugin/main.c),$(BUILD)/fluxon-bridge) $(if $(wildcard plugin/fluxonctl.c),$(BUILD)/fluxonctl)

UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/unit/%)
INTEG_BIN  := $(INTEG_SRC:tests/integration/%.c=$(BUILD)/tests/integration/%)
BENCH_BIN  := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/tests/bench/%)
FUZZ_BIN   := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/tests/fuzz/%)

# Keep object files of test programs (make would delete them as intermediates and rebuild).
.SECONDARY:

.PHONY: all deps test test-unit test-integration check tsan valgrind run bench soak clean tests \
        fuzz fuzz-build fuzz-corpus

all: $(LIBLEASE) $(if $(BRIDGE_OBJ),$(LIBBRIDGE)) $(if $(PLUGIN_OBJ),$(LIBPLUGIN)) $(BINS) tests $(BENCH_BIN)

tests: $(UNIT_BIN) $(INTEG_BIN)

deps:
	@bash scripts/install-deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(LIBLEASE): $(LEASE_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(LIBBRIDGE): $(BRIDGE_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(LIBPLUGIN): $(PLUGIN_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

LIBS := $(if $(PLUGIN_OBJ),$(LIBPLUGIN)) $(if $(BRIDGE_OBJ),$(LIBBRIDGE)) $(LIBLEASE)

$(BUILD)/fluxon-bridge: $(BUILD)/plugin/main.o $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBS) $(PLUGIN_LDLIBS) $(LDLIBS)

$(BUILD)/fluxonctl: $(BUILD)/plugin/fluxonctl.o $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBS) $(PLUGIN_LDLIBS) $(LDLIBS)

$(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBS) -lcmocka $(PLUGIN_LDLIBS) $(LDLIBS)

$(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(SUPPORT_OBJ) $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(SUPPORT_OBJ) $(LIBS) -lcmocka $(PLUGIN_LDLIBS) $(LDLIBS)

$(BUILD)/tests/fuzz/%: $(BUILD)/tests/fuzz/%.o $(LIBS)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $< $(LIBS) $(PLUGIN_LDLIBS) $(LDLIBS)

$(BUILD)/tests/bench/%: $(BUILD)/tests/bench/%.o $(SUPPORT_OBJ) $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(SUPPORT_OBJ) $(LIBS) $(PLUGIN_LDLIBS) $(LDLIBS)

test: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) bash tests/run.sh

test-unit: all
	@BUILD=$(BUILD) bash tests/run.sh unit

test-integration: all
	@BUILD=$(BUILD) bash tests/run.sh integration

check: deps
	@$(MAKE) --no-print-directory BUILD=build-san SAN=address OPT="-O1 -g" all
	@BUILD=build-san FXT_SANITIZED=1 bash tests/run.sh

tsan: deps
	@$(MAKE) --no-print-directory BUILD=build-tsan SAN=thread OPT="-O1 -g" all
	@BUILD=build-tsan FXT_SANITIZED=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" bash tests/run.sh unit integration

valgrind: all
	@BUILD=$(BUILD) FXT_VALGRIND=1 bash tests/run.sh unit

run: deps all
	@bash deploy/local/run.sh

# The fuzz targets and the project libraries they link, built by clang with libFuzzer, ASan and
# UBSan in their own build dir; then each target runs FUZZ_SECONDS (tests/fuzz/run.sh).
fuzz: deps
	@$(MAKE) --no-print-directory BUILD=build-fuzz CC=clang SAN=fuzzer OPT="-O1 -g" fuzz-build
	@bash tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

fuzz-build: $(FUZZ_BIN)

# Writes the seed corpora (run after a format change, then commit tests/fuzz/corpus/).
fuzz-corpus: $(BUILD)/tests/fuzz/make_corpus
	$< tests/fuzz/corpus

$(BUILD)/tests/fuzz/make_corpus: $(BUILD)/tests/fuzz/make_corpus.o $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBS) $(PLUGIN_LDLIBS) $(LDLIBS)

bench: deps all
	@bash tests/bench/run.sh

soak: deps all
	@bash tests/bench/run.sh --soak 300

clean:
	rm -rf build build-san build-tsan build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
