# Sourced by the GPU machine's scripts: where the libraries unet loads at run time come from.
#  cuDNN: the system's where the dynamic loader finds one (that machine's CUDA install has 9.14 in
#    /usr/lib/x86_64-linux-gnu, what `unet` loads there by default), else PyTorch's nvidia-cudnn
#    package. PyTorch's package carries 9.19, with which unet's seed64 tf32 step took 1% longer
#    (H200, same run, 2026-11-29: docs/speed-log.md); UNET_GPU_CUDNN=torch picks it anyway.
#  NCCL: PyTorch's nvidia-nccl package.
# unet profile's "Convolution library:" line and bench.py's heading name the cuDNN a run loaded.
gpu_libs_mods="nvidia.nccl"
gpu_libs_sys=0  # a cuDNN 9 where unet's dlopen finds one without help (kernels/conv/cudnn.cu)
ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 ' && gpu_libs_sys=1
for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64; do [ -e "$d/libcudnn.so.9" ] && gpu_libs_sys=1; done
if [ "${UNET_GPU_CUDNN:-}" = torch ] || [ $gpu_libs_sys = 0 ]; then
  gpu_libs_mods="nvidia.cudnn, nvidia.nccl"
fi
gpu_libs=$(python3 -c "import os, $gpu_libs_mods
print(':'.join(os.path.join(p, 'lib') for m in ($gpu_libs_mods,) for p in m.__path__))" 2>/dev/null)
[ -n "$gpu_libs" ] && export LD_LIBRARY_PATH="$gpu_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset gpu_libs gpu_libs_mods gpu_libs_sys
