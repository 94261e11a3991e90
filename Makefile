# fluxon-nats -- build, test, run, bench.
#
#   make          build the libraries, tools and test programs
#   make test     install missing packages, build, run every test (unit, integration, e2e)
#   make check    the same tests under ASan+UBSan (separate build dir)
#   make tsan     unit and integration tests under ThreadSanitizer, then a TSan-built fluxon-bridge
#                 driving the daemon's core e2e tests (TSAN_E2E); any report fails the run
#   make valgrind unit tests under valgrind (leak check)
#   SLOW=N        slow-build factor for every time bound (a loaded machine: make test SLOW=2);
#                 make check, tsan and valgrind multiply their own factor by it
#   make run      install, build, start a local etcd + nats-server, run the bridge
#   make bench    benchmarks (tables into BENCHMARKS.md)
#   make soak     5-minute bridge memory soak under full load (nats_bench -S 300)
#   make chaos    seeded random faults (kill -9, SIGSTOP, etcd/Redis/nats restarts, dropped etcd
#                 answers, subscriber churn, SIGHUP) under acked load, then a checker: fails on
#                 any acked message lost or phantom; CHAOS_SECONDS (default 600), CHAOS_SEED
#                 (default random, printed); make test runs chaos_fixed_seed (60 s, seed 19)
#   make fuzz     libFuzzer targets (tests/fuzz/, clang, ASan+UBSan, build dir build-fuzz), each
#                 run for FUZZ_SECONDS (default 30) from its seed corpus; non-zero on any crash
#   make fuzz-corpus  rewrite the seed corpora tests/fuzz/corpus/ (after a format change)
#   make layers   prove the layering (plugin -> bridge -> lease): each layer compiles with only
#                 its own and lower include paths, includes no header of a higher layer, and
#                 its library links without the symbols of a higher layer; and no module cycle
#                 inside a layer of CYCLES_STRICT (default every layer: "lease bridge plugin")
#   make install  fluxon-bridge, fluxonctl, systemd units, docs and example configs
#                 (PREFIX=/usr/local, DESTDIR honoured)
#   make clean

CC      ?= cc
BUILD   ?= build
SAN     ?=
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wstrict-prototypes -Wwrite-strings -Wshadow -Wno-missing-field-initializers
OPT     ?= -O2 -g
CFLAGS  += $(CSTD) $(WARN) $(OPT) -pthread -MMD -MP
LDLIBS  += -lcurl -lcjson -lhiredis -lpthread -lm
PLUGIN_LDLIBS := -lnats -lmicrohttpd -lcrypto

# Layers: plugin/ -> bridge/ -> lease/. A layer sees only its own headers and those of the layers
# below it: the include path of every object is chosen by its layer (never -I. or a higher
# layer), and so are the libraries a test program links.
LEASE_INC  := -Ilease
BRIDGE_INC := -Ibridge -Ilease
PLUGIN_INC := -Iplugin -Ibridge -Ilease
# Test programs, benches and fuzz targets of the lease and bridge layers (by file name, without
# .c); everything else in tests/ belongs to the plugin layer. Tests add -I. for tests/support/,
# whose files (fxt, fxt_proxy) use no project header and so compile at the lowest layer.
LEASE_TESTS  := fxt fxt_proxy test_b64 test_resp test_etcd_json test_etcd_pb test_fx_err test_lease_registry test_url test_etcd test_kv \
                test_kv_redis test_lease etcd_bench payload_bench fuzz_etcd_json fuzz_etcd_pb
BRIDGE_TESTS := test_bridge_flatdict test_bridge_keys test_bridge_lifecycle test_bridge_meta test_bridge_segment \
                test_chanq test_inspect test_jsext test_mpmc test_mpsc test_mq_accept test_mq_edges mq_bench \
                fuzz_flatdict fuzz_segment test_claim_table test_delivery_engine test_delay test_executor \
                test_commit_pool test_chanq_prod
test_layer = $(if $(filter $(LEASE_TESTS),$(1)),lease,$(if $(filter $(BRIDGE_TESTS),$(1)),bridge,plugin))
# The layer of the target being built ($@: an object or a program under $(BUILD)).
layer_of = $(if $(filter $(BUILD)/lease/%,$@),lease,$(if $(filter $(BUILD)/bridge/%,$@),bridge,$(if \
           $(filter $(BUILD)/tests/%,$@),$(call test_layer,$(basename $(notdir $@))),plugin)))
LAYER_INC_lease  := $(LEASE_INC)
LAYER_INC_bridge := $(BRIDGE_INC)
LAYER_INC_plugin := $(PLUGIN_INC)
obj_inc = $(LAYER_INC_$(layer_of)) $(if $(filter $(BUILD)/tests/%,$@),-I.)

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

.PHONY: all deps test test-unit test-integration check tsan valgrind run bench soak chaos clean tests \
        fuzz fuzz-build fuzz-corpus layers install

all: $(LIBLEASE) $(if $(BRIDGE_OBJ),$(LIBBRIDGE)) $(if $(PLUGIN_OBJ),$(LIBPLUGIN)) $(BINS) tests $(BENCH_BIN)

tests: $(UNIT_BIN) $(INTEG_BIN) $(BUILD)/tests/e2e/fxt-reap

# The e2e runner runs under this subreaper (tests/e2e/run.sh): whatever the runner started is
# killed when it ends, also when it is SIGKILLed. No sanitizer, no project header.
$(BUILD)/tests/e2e/fxt-reap: tests/e2e/reap/fxt_reap.c
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) -O2 -o $@ $<

deps:
	@bash scripts/install-deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(obj_inc) -c $< -o $@

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
# What a program of each layer links: its layer's library and those below, and only the plugin
# layer gets NATS, libmicrohttpd and libcrypto.
LAYER_LIBS_lease    := $(LIBLEASE)
LAYER_LIBS_bridge   := $(if $(BRIDGE_OBJ),$(LIBBRIDGE)) $(LIBLEASE)
LAYER_LIBS_plugin   := $(LIBS)
LAYER_LDLIBS_lease  := $(LDLIBS)
LAYER_LDLIBS_bridge := $(LDLIBS)
LAYER_LDLIBS_plugin := $(PLUGIN_LDLIBS) $(LDLIBS)
prog_libs   = $(LAYER_LIBS_$(layer_of))
prog_ldlibs = $(LAYER_LDLIBS_$(layer_of))

$(BUILD)/fluxon-bridge: $(BUILD)/plugin/main.o $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBS) $(PLUGIN_LDLIBS) $(LDLIBS)

$(BUILD)/fluxonctl: $(BUILD)/plugin/fluxonctl.o $(LIBS)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBS) $(PLUGIN_LDLIBS) $(LDLIBS)

# Secondary expansion: a test program depends only on the libraries of its own layer.
.SECONDEXPANSION:
$(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $$(LAYER_LIBS_$$(call test_layer,$$*))
	$(CC) $(LDFLAGS) -o $@ $< $(prog_libs) -lcmocka $(prog_ldlibs)

$(BUILD)/tests/integration/%: $(BUILD)/tests/integration/%.o $(SUPPORT_OBJ) $$(LAYER_LIBS_$$(call test_layer,$$*))
	$(CC) $(LDFLAGS) -o $@ $< $(SUPPORT_OBJ) $(prog_libs) -lcmocka $(prog_ldlibs)

$(BUILD)/tests/fuzz/%: $(BUILD)/tests/fuzz/%.o $$(LAYER_LIBS_$$(call test_layer,$$*))
	$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $< $(prog_libs) $(prog_ldlibs)

$(BUILD)/tests/bench/%: $(BUILD)/tests/bench/%.o $(SUPPORT_OBJ) $$(LAYER_LIBS_$$(call test_layer,$$*))
	$(CC) $(LDFLAGS) -o $@ $< $(SUPPORT_OBJ) $(prog_libs) $(prog_ldlibs)

# The slow-build factor (tests/run.sh --slow): time bounds and deadlines of every test are
# multiplied by it. Sanitizer and valgrind runs are slower by their nature; SLOW adds a loaded
# machine on top.
SLOW ?= 1

test: deps
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory layers
	@BUILD=$(BUILD) bash tests/run.sh --slow $(SLOW)

test-unit: all
	@BUILD=$(BUILD) bash tests/run.sh unit

test-integration: all
	@BUILD=$(BUILD) bash tests/run.sh integration

check: deps
	@$(MAKE) --no-print-directory BUILD=build-san SAN=address OPT="-O1 -g" all
	@BUILD=build-san FXT_SANITIZED=1 bash tests/run.sh --slow $$((3 * $(SLOW)))

# The daemon under TSan: the e2e tests that drive the bridge's threaded core -- capture batching
# and PubAcks, claims and deliveries, the ack path (ack, ack requests, nak, term, DLQ), SIGHUP
# reloads, the SIGTERM drain, kill -9 and rolling restarts, departed claims moving to another
# bridge, interest release, the Redis payload plane, delayed messages (writers, mover, counter) and
# the redrive API thread -- against the TSan-built fluxon-bridge. A
# report makes the bridge exit (halt_on_error, exitcode 66) and the e2e library fails the test
# with the report (tests/e2e/lib/stack.mjs). The other e2e tests are reported as skipped (make
# test and make check run them). About 3 minutes on the 2-core machine.
TSAN_E2E := ^(e2e_publish_ack_and_consume|e2e_nak_redelivery_and_dlq|e2e_client_ack_path|e2e_ack_request_replies|e2e_sigterm_drain|e2e_settings_change_applies|e2e_admin_and_ops|sighup_reload_memory_flat|e2e_departed_claim_backlog_moves|e2e_bridge_kill9_no_loss|e2e_two_bridges|e2e_rolling_restart_two_bridges|e2e_redis_plane_publish_consume|e2e_store_and_forward|e2e_interest_release|e2e_burst_spreads_in_flight|e2e_dead_bridge_sub_mpscs_reclaimed|e2e_delayed_delivery|e2e_delayed_survives_restart|e2e_redrive_api)$$

tsan: deps
	@$(MAKE) --no-print-directory BUILD=build-tsan SAN=thread OPT="-O1 -g" all
	@BUILD=build-tsan FXT_SANITIZED=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 exitcode=66" \
	  bash tests/run.sh --slow $$((5 * $(SLOW))) --e2e-filter '$(TSAN_E2E)' \
	  --e2e-skip-reason "not in the TSan daemon pass (TSAN_E2E in the Makefile); make test and make check run it" \
	  unit integration e2e

valgrind: all
	@BUILD=$(BUILD) FXT_VALGRIND=1 bash tests/run.sh --slow $$((5 * $(SLOW))) unit

# See scripts/check-layers.sh: includes, per-layer compile, library symbols. Then
# scripts/include_cycles.sh: the module dependency cycles of each layer; a cycle in a layer named
# in CYCLES_STRICT fails (the other layers' cycles are listed only).
CYCLES_STRICT ?= lease bridge plugin
layers: $(LIBLEASE) $(if $(BRIDGE_OBJ),$(LIBBRIDGE)) $(if $(PLUGIN_OBJ),$(LIBPLUGIN))
	@CC="$(CC)" CFLAGS="$(CSTD) $(WARN) -pthread" BUILD="$(BUILD)" LEASE_TESTS="$(LEASE_TESTS)" \
	  BRIDGE_TESTS="$(BRIDGE_TESTS)" bash scripts/check-layers.sh
	@BUILD="$(BUILD)" CYCLES_STRICT="$(CYCLES_STRICT)" bash scripts/include_cycles.sh

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
	@bash scripts/install-deps.sh --bench
	@bash tests/bench/run.sh

soak: deps all
	@bash tests/bench/run.sh --soak 300

chaos: deps all
	@BUILD=$(BUILD) bash tests/chaos/run.sh --full

# Install layout (DESTDIR is prepended to every path). The systemd units name the binary, the docs
# and the config by absolute path: they are installed with those paths rewritten to match.
PREFIX         ?= /usr/local
BINDIR         ?= $(PREFIX)/bin
SYSTEMDUNITDIR ?= $(PREFIX)/lib/systemd/system
DOCDIR         ?= $(PREFIX)/share/doc/fluxon
SYSCONFDIR     ?= /etc
INSTALL        ?= install
UNIT_SED := -e 's|/usr/local/bin/fluxon-bridge|$(BINDIR)/fluxon-bridge|g' \
            -e 's|/usr/local/share/doc/fluxon|$(DOCDIR)|g' -e 's|/etc/fluxon/|$(SYSCONFDIR)/fluxon/|g'

# fluxon-bridge and fluxonctl to BINDIR; the units of deploy/systemd/ to SYSTEMDUNITDIR; README,
# docs/ARCHITECTURE.md, docs/EXECUTOR.md and deploy/README.md (as DEPLOY.md) to DOCDIR, the example configs to
# DOCDIR/examples; SYSCONFDIR/fluxon/bridge.json from deploy/bridge-single.json unless a config
# is already there (never overwritten). Creates no user: see deploy/README.md.
install: $(BINS)
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(DOCDIR)/examples
	$(INSTALL) -m 0755 $(BINS) $(DESTDIR)$(BINDIR)/
	for u in deploy/systemd/*.service; do \
	  sed $(UNIT_SED) $$u >$(DESTDIR)$(SYSTEMDUNITDIR)/$$(basename $$u).tmp && \
	  chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/$$(basename $$u).tmp && \
	  mv $(DESTDIR)$(SYSTEMDUNITDIR)/$$(basename $$u).tmp $(DESTDIR)$(SYSTEMDUNITDIR)/$$(basename $$u) || exit 1; \
	done
	$(INSTALL) -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	$(INSTALL) -m 0644 docs/ARCHITECTURE.md $(DESTDIR)$(DOCDIR)/ARCHITECTURE.md
	$(INSTALL) -m 0644 docs/EXECUTOR.md $(DESTDIR)$(DOCDIR)/EXECUTOR.md
	$(INSTALL) -m 0644 deploy/README.md $(DESTDIR)$(DOCDIR)/DEPLOY.md
	$(INSTALL) -m 0644 deploy/*.json deploy/nats-server.conf $(DESTDIR)$(DOCDIR)/examples/
	$(INSTALL) -d -m 0750 $(DESTDIR)$(SYSCONFDIR)/fluxon
	[ -e $(DESTDIR)$(SYSCONFDIR)/fluxon/bridge.json ] || \
	  $(INSTALL) -m 0640 deploy/bridge-single.json $(DESTDIR)$(SYSCONFDIR)/fluxon/bridge.json

clean:
	rm -rf build build-san build-tsan build-fuzz build-tools

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
