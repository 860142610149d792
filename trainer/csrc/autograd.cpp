// The two libtorch autograd calls tch does not expose, for the trainer's flat gradients
// and its gradient exchange overlapped with backward (trainer/src/autograd.rs):
// - pointing a parameter's `.grad` at a given tensor (a view of a flat buffer), which
//   AccumulateGrad then accumulates into in place, as DDP's gradient_as_bucket_view does;
// - a post-accumulate-grad hook, called by AccumulateGrad once a parameter's gradient of
//   the running backward is complete.
// Every function returns NULL on success or an error message the caller frees with
// ft_free_error; no C++ exception crosses into Rust.

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdlib>

#include "guarded.h"

namespace {

using ReadyFn = void (*)(void* context, size_t index);

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  ReadyFn fn;
  void* context;
  size_t index;
  ReadyHook(ReadyFn f, void* c, size_t i) : fn(f), context(c), index(i) {}
  void operator()(const torch::autograd::Variable&) override { fn(context, index); }
};

}  // namespace

extern "C" {

char* ft_set_grad(at::Tensor* param, const at::Tensor* grad) {
  return ft::guarded([&] { param->mutable_grad() = *grad; });
}

char* ft_set_grad_ready_hook(at::Tensor* param, ReadyFn fn, void* context, size_t index) {
  return ft::guarded([&] {
    TORCH_CHECK(param->is_leaf() && param->requires_grad(),
                "a gradient hook needs a leaf tensor that requires grad");
    torch::autograd::impl::set_post_acc_grad_hooks(
        *param, std::make_unique<ReadyHook>(fn, context, index));
  });
}

char* ft_clear_grad_ready_hook(at::Tensor* param) {
  return ft::guarded([&] { torch::autograd::impl::post_acc_grad_hooks(*param).reset(); });
}

void ft_free_error(char* error) { std::free(error); }

}  // extern "C"
