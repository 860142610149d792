// What every shim function of csrc/ shares: a C++ exception never crosses into Rust; it
// becomes an error message (malloc'ed, freed by the caller with ft_free_error), NULL on
// success.
#pragma once

#include <cstdlib>
#include <cstring>
#include <exception>

namespace ft {

inline char* error_copy(const char* what) {
  size_t n = std::strlen(what) + 1;
  char* out = static_cast<char*>(std::malloc(n));
  if (out != nullptr) std::memcpy(out, what, n);
  return out;
}

template <typename F>
char* guarded(F f) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    return error_copy(e.what());
  } catch (...) {
    return error_copy("unknown C++ exception");
  }
}

}  // namespace ft
