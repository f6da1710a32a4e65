# Makefile — builds train_gpt2 (CPU always; CUDA when nvcc is found), the
# tests and the tools.
#   make               build everything that this machine can build
#   make NO_CUDA=1     CPU only, even where nvcc exists
#   make NO_MPI=1      no MPI (single process only)
#   make CUDA_ARCH=... override the GPU target (default: sm_90 code + PTX)
#   make test          the CPU test suite (what CI runs)
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
CFLAGS += -std=gnu11 -Wall -Wextra -fopenmp -ffp-contract=off -MMD -MP
LDLIBS := -lm -fopenmp
ifneq ($(MPICC),)
  CFLAGS += -DUSE_MPI
endif

CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-fopenmp
ifneq ($(NVCC),)
  CFLAGS += -DUSE_CUDA -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lnccl -lstdc++
  CU_SRCS := $(wildcard kernels/cuda/*.cu comm/*.cu)
endif

BUILD := build
LIB_SRCS := $(filter-out train_gpt2.c, $(wildcard common/*.c kernels/*.c model/*.c ddp/*.c zero/*.c comm/*.c data/*.c checkpoint/*.c))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o) $(CU_SRCS:%.cu=$(BUILD)/%.cu.o)
TEST_SRCS := $(wildcard test/test_*.c)
TESTS := $(TEST_SRCS:test/%.c=$(BUILD)/%)
TOOL_SRCS := $(wildcard tools/*.c)
TOOLS := $(TOOL_SRCS:tools/%.c=$(BUILD)/%)

.PHONY: all test test-gpu deps clean
all: train_gpt2 $(TESTS) $(TOOLS)

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
	$(NVCC) $(NVCCFLAGS) -I$(CUDA_HOME)/include -c $< -o $@

$(BUILD)/libgpt2.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

train_gpt2: $(BUILD)/train_gpt2.o $(BUILD)/libgpt2.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/test_%: $(BUILD)/test/test_%.o $(BUILD)/libgpt2.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/%: $(BUILD)/tools/%.o $(BUILD)/libgpt2.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# The test command: installs what it needs, builds (a fresh make, so that an
# mpicc installed just now is used), runs the CPU suite.
test: deps
	$(MAKE) all
	bash test/run_tests.sh

test-gpu: all
	bash test/run_tests_gpu.sh

clean:
	rm -rf $(BUILD) train_gpt2

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
