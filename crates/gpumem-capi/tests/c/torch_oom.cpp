// PyTorch's entry point from C++ as PyTorch calls it: a zero-byte request is NULL, a normal one
// a pointer, and an allocation over the hard limit throws with gpumem's explanation. Without
// PyTorch's libc10 in the process the exception is a std::runtime_error (with it,
// c10::OutOfMemoryError: scripts/test-python.sh's local PyTorch check covers that).
#include "gpumem.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>

int main() {
  if (gpumem_torch_alloc(0, 0, nullptr) != nullptr) return 2;
  void* p = gpumem_torch_alloc(1000, 0, reinterpret_cast<void*>(0x99));
  if (p == nullptr) return 3;
  try {
    gpumem_torch_alloc(size_t(1) << 40, 0, nullptr);
    std::puts("no exception");
    return 4;
  } catch (const std::runtime_error& e) {
    if (std::strstr(e.what(), "out of memory") == nullptr) {
      std::printf("unexpected message: %s\n", e.what());
      return 5;
    }
  }
  gpumem_torch_free(p, 1000, 0, reinterpret_cast<void*>(0x99));
  gpumem_torch_free(nullptr, 0, 0, nullptr);
  std::puts("ok");
  return 0;
}
