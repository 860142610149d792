// The libtorch memory call tch exposes only in its deprecated form: pinning a host tensor
// for an asynchronous copy to the GPU. tch's pin_memory(device) passes the device argument,
// which PyTorch 2.11 deprecates with a warning on every call (twice per micro-batch in the
// trainer's logs); at::Tensor::pin_memory() without it pins for the current accelerator.

#include <ATen/ATen.h>

#include "guarded.h"

extern "C" {

char* ft_pin_memory(const at::Tensor* self, at::Tensor** out) {
  return ft::guarded([&] { *out = new at::Tensor(self->pin_memory()); });
}

}  // extern "C"
