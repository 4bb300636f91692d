// The C++ half of gpumem's PyTorch entry point. PyTorch's CUDAPluggableAllocator stores
// whatever pointer the allocation function returns, a null one included, in a tensor
// (torch/csrc/cuda/CUDAPluggableAllocator.cpp, `malloc`); the only way to fail an allocation
// is a C++ exception, which PyTorch's Python bindings turn into a Python exception carrying
// the exception's what(). Rust cannot throw one, so the Rust entry point calls
// gpumem_capi_throw, declared "C-unwind" on the Rust side so that the exception may pass
// through it.
//
// Out of memory becomes c10::OutOfMemoryError — torch.OutOfMemoryError in Python, what
// `except torch.cuda.OutOfMemoryError` catches — when PyTorch's libc10 is loaded in the
// process (it is whenever PyTorch calls us): its typeinfo and constructor are looked up with
// dlsym, so nothing here links against or includes PyTorch. Otherwise, and for every other
// error, a std::runtime_error, which PyTorch reports as RuntimeError.

#include <cxxabi.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <typeinfo>

namespace {

// c10::SourceLocation's layout (c10/util/StringUtil.h).
struct SourceLocation {
  const char* function;
  const char* file;
  std::uint32_t line;
};

// c10::OutOfMemoryError::OutOfMemoryError(c10::SourceLocation, std::string), called as the
// Itanium C++ ABI calls a constructor: the object first, then the arguments.
using OomConstructor = void (*)(void* self, SourceLocation where, std::string message);

// Room for a c10::OutOfMemoryError (about 150 bytes in PyTorch 2.x): its exact size is not
// needed, only enough.
constexpr std::size_t kOomObjectBytes = 1024;

// Destroys the thrown c10 error through its virtual destructor (std::exception is its first
// and only base, at offset 0).
void destroy_c10_error(void* object) {
  static_cast<std::exception*>(object)->~exception();
}

[[noreturn]] void throw_c10_out_of_memory(const char* message) {
  void* type = dlsym(RTLD_DEFAULT, "_ZTIN3c1016OutOfMemoryErrorE");
  void* constructor = dlsym(
      RTLD_DEFAULT,
      "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_"
      "traitsIcESaIcEEE");
  if (type == nullptr || constructor == nullptr) {
    throw std::runtime_error(message);
  }
  void* object = abi::__cxa_allocate_exception(kOomObjectBytes);
  std::memset(object, 0, kOomObjectBytes);
  SourceLocation where{"gpumem_torch_alloc", "gpumem-capi", 0};
  reinterpret_cast<OomConstructor>(constructor)(object, where, std::string(message));
  abi::__cxa_throw(object, static_cast<std::type_info*>(type), destroy_c10_error);
}

}  // namespace

// Throws the allocation failure described by `message`: c10::OutOfMemoryError when
// `out_of_memory` is non-zero and PyTorch is loaded, std::runtime_error otherwise.
extern "C" [[noreturn]] void gpumem_capi_throw(const char* message, int out_of_memory) {
  if (out_of_memory != 0) {
    throw_c10_out_of_memory(message);
  }
  throw std::runtime_error(message);
}
