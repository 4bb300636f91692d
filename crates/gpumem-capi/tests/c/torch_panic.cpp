// A panic inside PyTorch's entry point reaches C++ as the std::runtime_error PyTorch turns
// into RuntimeError, with the entry point and the panic in what() (feature fault-injection):
// at the call's start the pool goes on working; inside the pool's locked state device 5's
// pool is unusable and every later allocation there throws the reason.
#define GPUMEM_FAULT_INJECTION 1
#include "gpumem.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

// The what() of the exception gpumem_torch_alloc(size, device) throws; "" if none.
static std::string thrown(size_t size, int device) {
  try {
    void* p = gpumem_torch_alloc(size, device, nullptr);
    gpumem_torch_free(p, size, device, nullptr);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

static bool has(const std::string& text, const char* part) {
  if (text.find(part) != std::string::npos) return true;
  std::printf("missing \"%s\" in \"%s\"\n", part, text.c_str());
  return false;
}

int main() {
  if (gpumem_test_inject_panic("gpumem_torch_alloc", 0) != GPUMEM_OK) return 2;
  std::string what = thrown(1000, 0);
  if (!has(what, "internal error in gpumem_torch_alloc: panicked: injected panic")) return 3;
  if (!has(what, "the pools stay usable")) return 4;
  if (!thrown(1000, 0).empty()) return 5;

  if (gpumem_test_inject_panic("gpumem_torch_alloc", 1) != GPUMEM_OK) return 6;
  what = thrown(1000, 5);
  if (!has(what, "injected panic inside the pool's locked state in gpumem_torch_alloc")) return 7;
  if (!has(what, "the pool of device 5 was changing its state")) return 8;
  what = thrown(1000, 5);
  if (!has(what, "the gpumem pool of device 5 is unusable after an internal error in "
                 "gpumem_torch_alloc")) return 9;
  if (!thrown(1000, 0).empty()) return 10;
  std::puts("ok");
  return 0;
}
