// AdamW in one pass over a group's flat buffers: libtorch's _fused_adamw_ (PyTorch's
// `torch.optim.AdamW(fused=True)`), which reads the parameter, its gradient and both moments
// once and writes them back, where the op-by-op update makes eight passes. tch does not
// expose it. Errors come back as strings (guarded.h).

#include <ATen/ATen.h>

#include "guarded.h"

extern "C" {

char* ft_fused_adamw(at::Tensor* param, const at::Tensor* grad, at::Tensor* exp_avg,
                     at::Tensor* exp_avg_sq, double step, double lr, double beta1, double beta2,
                     double weight_decay, double eps) {
  // The caller holds autograd off (tch::no_grad).
  return ft::guarded([&] {
    // The update's number (PyTorch's state["step"]), as the op takes it: a float tensor.
    at::Tensor steps = at::full({}, step, param->options().dtype(at::kFloat));
    at::_fused_adamw_({*param}, {*grad}, {*exp_avg}, {*exp_avg_sq}, {}, {steps}, lr, beta1,
                      beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, /*found_inf=*/std::nullopt);
  });
}

}  // extern "C"
