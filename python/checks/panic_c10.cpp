// Links PyTorch's libc10 and the C library built with the test-only fault-injection feature
// (its first argument is unused): a panic armed in gpumem's PyTorch entry point arrives as a
// std::exception that is not a c10::Error — what PyTorch's Python bindings (HANDLE_TH_ERRORS)
// turn into RuntimeError with what() as the message — naming the entry point and the panic;
// afterwards the entry point allocates, and an OOM is still c10::OutOfMemoryError. Built and
// run by torch_cpu_panics.py.
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>
#include <exception>

extern "C" void* gpumem_torch_alloc(size_t size, int device, void* stream);
extern "C" void gpumem_torch_free(void* ptr, size_t size, int device, void* stream);
extern "C" int gpumem_test_inject_panic(const char* entry_point, int while_pool_locked);

int main() {
  if (gpumem_test_inject_panic("gpumem_torch_alloc", 0) != 0) {
    std::puts("cannot arm the panic");
    return 1;
  }
  try {
    gpumem_torch_alloc(1000, 0, nullptr);
    std::puts("no exception for the panic");
    return 1;
  } catch (const c10::Error& e) {
    std::printf("the panic is a c10::Error, not RuntimeError's std::exception: %s\n",
                e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    if (std::strstr(e.what(), "internal error in gpumem_torch_alloc: panicked: injected panic") ==
        nullptr) {
      std::printf("unexpected message: %s\n", e.what());
      return 1;
    }
  }
  void* p = gpumem_torch_alloc(1000, 0, nullptr);
  if (p == nullptr) {
    std::puts("no allocation after the panic");
    return 1;
  }
  gpumem_torch_free(p, 1000, 0, nullptr);
  try {
    gpumem_torch_alloc(size_t(1) << 40, 0, nullptr);
  } catch (const c10::OutOfMemoryError&) {
    std::puts("ok");
    return 0;
  } catch (const std::exception& e) {
    std::printf("an OOM after the panic is not c10::OutOfMemoryError: %s\n", e.what());
    return 1;
  }
  std::puts("no exception for the OOM");
  return 1;
}
