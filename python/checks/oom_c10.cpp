// Links PyTorch's libc10 and checks that gpumem's PyTorch entry point throws the very
// c10::OutOfMemoryError PyTorch's bindings turn into torch.OutOfMemoryError, with gpumem's
// explanation as its message. Built and run by torch_cpu.py.
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>

extern "C" void* gpumem_torch_alloc(size_t size, int device, void* stream);

int main() {
  try {
    gpumem_torch_alloc(size_t(1) << 40, 0, nullptr);
  } catch (const c10::OutOfMemoryError& e) {
    const char* text = e.what_without_backtrace();
    if (std::strstr(text, "out of memory") && std::strstr(text, "What to try")) {
      std::puts("ok");
      return 0;
    }
    std::printf("unexpected message: %s\n", text);
    return 1;
  } catch (const std::exception& e) {
    std::printf("not a c10::OutOfMemoryError: %s\n", e.what());
    return 1;
  }
  std::puts("no exception");
  return 1;
}
