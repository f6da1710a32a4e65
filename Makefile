# Makefile — builds train_gpt2 (CPU always; CUDA when nvcc is found), the
# tests and the tools.
#   make               build everything that this machine can build
#   make NO_CUDA=1     CPU only, even where nvcc exists
#   make NO_MPI=1      no MPI (single process only)
#   make CUDA_ARCH=... override the GPU target (default: sm_90a code + sm_90 PTX)
#   make test          the CPU test suite (what CI runs)
#   make asan          unit tests, trainer and fuzz replays with AddressSanitizer and
#                      UndefinedBehaviorSanitizer (gcc, CPU only, no MPI) in build-asan/
#   make fuzz          libFuzzer harnesses (clang) of the token-shard, model, tokenizer
#                      and checkpoint parsers, each run FUZZ_SECONDS (default 60) from
#                      the seeds in test/fuzz/<harness>/; crashes land in build-fuzz/crashes/
#   make test-gpu      the GPU test suite (on the H200 machine)

NO_CUDA ?= 0
NO_MPI ?= 0
CUDA_HOME ?= /usr/local/cuda
CPU_ARCH ?= native

MPICC := $(shell command -v mpicc 2>/dev/null)
ifeq ($(NO_MPI),1)
  MPICC :=
endif
NVCC := $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
ifeq ($(NO_CUDA),1)
  NVCC :=
endif

CC := $(if $(MPICC),$(MPICC),gcc)
CFLAGS ?= -O3 -march=$(CPU_ARCH)
# -ffp-contract=off: no fused multiply-add unless the source asks for one (the CPU results are
# fixed by the source, whatever the compiler); -fno-math-errno: sqrtf needs no errno check, so
# loops that call it vectorise (the square root is exact either way: the same bits)
CFLAGS += -std=gnu11 -Wall -Wextra -fopenmp -ffp-contract=off -fno-math-errno -MMD -MP
EXTRA_CFLAGS ?=
CFLAGS += $(EXTRA_CFLAGS)
LDLIBS := -lm -fopenmp
ifneq ($(MPICC),)
  CFLAGS += -DUSE_MPI
endif

CUDA_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-fopenmp
ifneq ($(NVCC),)
  CFLAGS += -DUSE_CUDA -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lnccl -lstdc++
  CU_SRCS := $(wildcard kernels/cuda/*.cu comm/*.cu)
endif

BUILD := build
LIB_SRCS := $(filter-out train_gpt2.c, $(wildcard common/*.c kernels/*.c model/*.c ddp/*.c zero/*.c comm/*.c data/*.c checkpoint/*.c train/*.c pipeline/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o) $(CU_SRCS:%.cu=$(BUILD)/%.cu.o)
TEST_SRCS := $(wildcard test/test_*.c)
TESTS := $(TEST_SRCS:test/%.c=$(BUILD)/%)
TOOL_SRCS := $(filter-out tools/nccl_bench.c, $(wildcard tools/*.c))
TOOLS := $(TOOL_SRCS:tools/%.c=$(BUILD)/%)
# NCCL bandwidth benchmark (tools/bench_multigpu.sh): only where both nvcc and mpicc are found
ifneq ($(and $(NVCC),$(MPICC)),)
  TOOLS += $(BUILD)/nccl_bench
endif
TRAINER ?= train_gpt2
# fuzz harnesses (tools/fuzz/): replayed without libFuzzer by make test
FUZZ_NAMES := shard model tokenizer checkpoint
FUZZ_REPLAYS := $(FUZZ_NAMES:%=$(BUILD)/fuzz_replay_%)
# the harnesses track what a parser cut short by fatal() had allocated or opened
FUZZ_WRAP := -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=posix_memalign,--wrap=free,--wrap=fopen,--wrap=fclose

.PHONY: all test test-gpu deps clean asan fuzz fuzz-deps format format-check
all: $(TRAINER) $(TESTS) $(TOOLS) $(FUZZ_REPLAYS)

# Installs missing Debian packages (Open MPI, node, gnuplot), then builds.
deps:
	bash tools/install_deps.sh

# Rebuild everything when the configuration changes (CUDA or not, MPI or not).
CONFIG_STAMP := $(BUILD)/config.$(if $(NVCC),cuda,nocuda).$(if $(MPICC),mpi,nompi)
$(CONFIG_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/config.* && find $(BUILD) -name '*.o' -delete
	@touch $@

$(BUILD)/%.o: %.c $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(CONFIG_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -I$(CUDA_HOME)/include -MMD -MP -c $< -o $@

$(BUILD)/libgpt2.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(TRAINER): $(BUILD)/train_gpt2.o $(BUILD)/libgpt2.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/test_%: $(BUILD)/test/test_%.o $(BUILD)/libgpt2.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/%: $(BUILD)/tools/%.o $(BUILD)/libgpt2.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# nccl_bench needs only util.c of the library, MPI (mpicc), cudart and NCCL
$(BUILD)/nccl_bench: $(BUILD)/tools/nccl_bench.o $(BUILD)/common/util.o
	$(CC) $(CFLAGS) $^ -o $@ -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lnccl -lm

.SECONDARY: $(FUZZ_NAMES:%=$(BUILD)/tools/fuzz/fuzz_%.o) $(BUILD)/tools/fuzz/fuzz_common.o $(BUILD)/tools/fuzz/fuzz_replay.o
$(BUILD)/fuzz_replay_%: $(BUILD)/tools/fuzz/fuzz_%.o $(BUILD)/tools/fuzz/fuzz_common.o $(BUILD)/tools/fuzz/fuzz_replay.o $(BUILD)/libgpt2.a
	$(CC) $(CFLAGS) $(FUZZ_WRAP) $^ -o $@ $(LDLIBS) -lpthread

# Sanitizer build: its own directory and trainer, so build/ and ./train_gpt2 stay as they are.
ASAN_DIR := build-asan
ASAN_FLAGS := -O2 -g -fno-omit-frame-pointer -fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all
asan:
	@mkdir -p $(ASAN_DIR); echo '$(ASAN_FLAGS)' | cmp -s - $(ASAN_DIR)/flags || \
	  { rm -rf $(ASAN_DIR); mkdir -p $(ASAN_DIR); echo '$(ASAN_FLAGS)' > $(ASAN_DIR)/flags; }
	CFLAGS="$(ASAN_FLAGS)" $(MAKE) BUILD=$(ASAN_DIR) TRAINER=$(ASAN_DIR)/train_gpt2 NO_CUDA=1 NO_MPI=1 all

# libFuzzer: clang, CPU only, no MPI; objects in build-fuzz/.
FUZZ_DIR := build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_CFLAGS := -std=gnu11 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined,float-cast-overflow \
  -fno-sanitize-recover=all -ffp-contract=off -Wall -Wextra -Wno-unknown-pragmas -MMD -MP
FUZZ_BINS := $(FUZZ_NAMES:%=$(FUZZ_DIR)/fuzz_%)

fuzz-deps:
	@command -v $(FUZZ_CC) >/dev/null 2>&1 || { echo "make fuzz: installing clang"; \
	  $$( [ "$$(id -u)" -ne 0 ] && echo sudo ) apt-get install -y -qq clang; }

$(FUZZ_DIR)/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

.SECONDARY: $(FUZZ_NAMES:%=$(FUZZ_DIR)/tools/fuzz/fuzz_%.o) $(FUZZ_DIR)/tools/fuzz/fuzz_common.o $(LIB_SRCS:%.c=$(FUZZ_DIR)/%.o)
$(FUZZ_DIR)/fuzz_%: $(FUZZ_DIR)/tools/fuzz/fuzz_%.o $(FUZZ_DIR)/tools/fuzz/fuzz_common.o $(LIB_SRCS:%.c=$(FUZZ_DIR)/%.o)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(FUZZ_WRAP) $^ -o $@ -lm -lpthread

# Each harness runs FUZZ_SECONDS from the committed seeds; new inputs go to
# build-fuzz/corpus/, a crash stops make with its input in build-fuzz/crashes/
# (commit it under test/fuzz/<harness>/ as a regression input once fixed).
fuzz: fuzz-deps
	@mkdir -p $(FUZZ_DIR); echo '$(FUZZ_CFLAGS)' | cmp -s - $(FUZZ_DIR)/flags || \
	  { rm -rf $(FUZZ_DIR); mkdir -p $(FUZZ_DIR); echo '$(FUZZ_CFLAGS)' > $(FUZZ_DIR)/flags; }
	$(MAKE) $(FUZZ_BINS)
	@for h in $(FUZZ_NAMES); do \
	  mkdir -p $(FUZZ_DIR)/corpus/$$h $(FUZZ_DIR)/crashes/$$h; \
	  echo "==== fuzz_$$h: $(FUZZ_SECONDS) s (log: $(FUZZ_DIR)/fuzz_$$h.log)"; \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    $(FUZZ_DIR)/fuzz_$$h $(FUZZ_DIR)/corpus/$$h test/fuzz/$$h -max_total_time=$(FUZZ_SECONDS) \
	    -max_len=16384 -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_DIR)/crashes/$$h/ >$(FUZZ_DIR)/fuzz_$$h.log 2>&1; rc=$$?; \
	  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' $(FUZZ_DIR)/fuzz_$$h.log; \
	  if [ $$rc -ne 0 ]; then tail -40 $(FUZZ_DIR)/fuzz_$$h.log; \
	    echo "fuzz_$$h found a crash: the input is in $(FUZZ_DIR)/crashes/$$h/"; exit 1; fi; \
	done

# The test command: installs what it needs, builds (a fresh make, so that an
# mpicc installed just now is used), builds the sanitizer configuration, runs
# the CPU suite.
test: deps
	$(MAKE) all
	$(MAKE) asan
	bash test/run_tests.sh

test-gpu: all
	bash test/run_tests_gpu.sh

# the C and CUDA sources in the style of .clang-format (CI runs format-check)
format:
	bash tools/format.sh

format-check:
	bash tools/format.sh --check

clean:
	rm -rf $(BUILD) $(TRAINER) $(ASAN_DIR) $(FUZZ_DIR)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
-include $(shell find $(FUZZ_DIR) -name '*.d' 2>/dev/null)
