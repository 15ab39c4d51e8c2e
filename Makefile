# The verbs people type. CMake does the build.
#   make demo   install dependencies, build, run scripts/demo.sh (Fashion-MNIST: prepare, train,
#               sample the shipped and the fresh model by class, plot the run) into demo/
#   make classifier-demo  scripts/classifier_demo.sh: a noisy classifier trained on Fashion-MNIST,
#               its noised-validation accuracy, the shipped model sampled with and without its
#               guidance, judged by a second (clean-image) classifier, demo/classifier_grid.png
#   make test   install dependencies, build, run every test
BUILD    ?= build
JOBS     ?= $(shell nproc)
CUDA_ARCH ?= 90
CMAKE_FLAGS ?=
ifdef CI
CMAKE_FLAGS += -DUNET_WERROR=ON
endif

DEB_PKGS := cmake g++ make pkg-config libcli11-dev libhdf5-dev libpng-dev libjpeg62-turbo-dev \
            zlib1g-dev libaec-dev nlohmann-json3-dev libgtest-dev python3 python3-numpy python3-h5py \
            python3-torch python3-matplotlib openmpi-bin
# Only `make demo` needs these (the tests make their own idx files).
DEMO_PKGS := dataset-fashion-mnist

.PHONY: all deps demo-deps build test demo classifier-demo gpu-test bench clean format

all: build

# Installs the missing Debian packages of a list (needs root or sudo; skipped when all are present).
define install_missing
@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
if [ -n "$$missing" ]; then \
  echo "installing:$$missing"; \
  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
fi
endef

deps:
	$(call install_missing,$(DEB_PKGS))

demo-deps:
	$(call install_missing,$(DEMO_PKGS))

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Passive OpenMP waits: JOBS test processes share the cores, and libgomp's threads would spin at
# each barrier as if they had the machine (2 cores: ctest 419 -> 305-375 s, test_model 15.5 -> 8.0 s)
test: build
	cd $(BUILD) && OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-passive} ctest --output-on-failure -j $(JOBS)

# Builds only the unet binary (not the tests): minutes saved on a small machine. Without a visible
# GPU the CUDA engine could not run, so the demo builds the CPU-only engine into its own directory
# (compiling the CUDA kernels would take most of the demo's time on 2 cores).
DEMO_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(DEMO_GPU),yes)
DEMO_BUILD ?= $(BUILD)
DEMO_CMAKE_FLAGS :=
else
DEMO_BUILD ?= $(BUILD)-cpu
DEMO_CMAKE_FLAGS := -DUNET_CUDA=OFF
endif

demo: deps demo-deps
	@[ -f $(DEMO_BUILD)/CMakeCache.txt ] || cmake -S . -B $(DEMO_BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH) $(CMAKE_FLAGS) $(DEMO_CMAKE_FLAGS)
	cmake --build $(DEMO_BUILD) -j $(JOBS) --target unet
	bash scripts/demo.sh $(DEMO_BUILD)/bin/unet

classifier-demo: deps demo-deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target unet
	bash scripts/classifier_demo.sh $(BUILD)/bin/unet

# On the GPU machine: every CUDA test with a summary (they skip without a GPU).
gpu-test:
	bash scripts/gpu_tests.sh $(BUILD)

clean:
	rm -rf $(BUILD)

format:
	clang-format -i cmd/*.cpp cmd/*.h lib/*.cpp lib/*.h lib/*/*.cpp lib/*/*.h kernels/*/*.cu kernels/*/*.cuh kernels/*/*.cpp kernels/*/*.h tests/*.cpp tests/*.h 2>/dev/null || true
