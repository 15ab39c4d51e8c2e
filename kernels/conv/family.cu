// The conv family's CUDA variants in priority order: direct kernels for forwards with at most 8
// output channels (the model's last layer; narrow.cu: "narrow_tc" on tensor cores for bf16 and tf32 3x3,
// "narrow" on f32 FMAs for the rest), that layer's data gradient ("narrow_dgrad", f32 FMAs) and the
// tf32 filter gradient of convs with at most 3 input or output channels (the first and last layers;
// "narrow_wgrad"), in fp32 mode unet's implicit GEMMs on FMAs (simt.cu), in tf32
// and bf16 on Hopper the 3x3 filter gradients of wgmma.cu (faster than cuDNN's in the step) and in
// tf32 its "wgmma_t" forwards and data gradients at width 64 with at most 64 outputs, the tf32 1x1 filter
// gradients on mma.sync (pointwise.cu; cuDNN's ran on sm80 GEMMs with split-K reduce launches), then cuDNN
// when it is present and has a deterministic engine for the shape (forwards with bias / residual as one fused
// cuDNN kernel where that timed faster, then with unet's row-block epilogue and bias gradients, then with the
// earlier elementwise ones), else unet's own im2col + cuBLAS; last, only when forced, as they are not faster
// than cuDNN so far: unet's bf16 tensor-core forward (mma.cu), and the Hopper (wgmma + TMA) forwards and data
// gradient of wgmma.cu (sm_90a builds).
#include "cuda_engine.cuh"

namespace unet {

void register_conv_cuda(CudaOps& ops) {
  register_conv_narrow(ops);
  register_conv_simt(ops);
#ifdef UNET_HAVE_SM90A
  register_conv_wgmma_first(ops);
#endif
  register_conv_pointwise(ops);
  register_conv_cudnn_epi(ops);
  register_conv_cudnn_fused(ops);
  register_conv_cudnn(ops);
  register_conv_im2col(ops);
  register_conv_mma(ops);
#ifdef UNET_HAVE_SM90A
  register_conv_wgmma(ops);
#endif
}

}  // namespace unet
