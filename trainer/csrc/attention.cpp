// Which fused kernels libtorch's scaled_dot_product_attention may pick (see
// src/attention.rs for why ferrotrain turns cuDNN's off): the switch torch.backends.cuda.
// enable_cudnn_sdp sets from Python, which tch does not expose.

#include <ATen/Context.h>

extern "C" {

void ft_sdp_use_cudnn(bool enabled) { at::globalContext().setSDPUseCuDNN(enabled); }

bool ft_sdp_cudnn_enabled() { return at::globalContext().userEnabledCuDNNSDP(); }

}  // extern "C"
