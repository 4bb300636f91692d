// The C++ half of gpumem's PyTorch entry point. PyTorch's CUDAPluggableAllocator stores
// whatever pointer the allocation function returns, a null one included, in a tensor
// (torch/csrc/cuda/CUDAPluggableAllocator.cpp, `malloc`); the only way to fail an allocation
// is a C++ exception, which PyTorch's Python bindings turn into a Python exception carrying
// the exception's what(). Rust cannot throw one, so the Rust entry point calls
// gpumem_capi_throw, declared "C-unwind" on the Rust side so that the exception may pass
// through it.
//
// Out of memory becomes c10::OutOfMemoryError — torch.OutOfMemoryError in Python, what
// `except torch.cuda.OutOfMemoryError` catches — when PyTorch's libraries are loaded in the
// process (they are whenever PyTorch calls us): its typeinfo and a constructor are looked up
// with dlsym, so nothing here links against or includes PyTorch. Python loads PyTorch's
// libraries with RTLD_LOCAL, out of the global scope, so libc10 and libc10_cuda are also
// searched by their sonames among the loaded objects (RTLD_NOLOAD). OutOfMemoryError only
// inherits c10::Error's constructors (`using Error::Error`), whose instances are emitted
// where PyTorch throws one — libc10 in CPU builds, libc10_cuda in CUDA builds — or nowhere:
// then the object is built by c10::Error's own exported constructor and given
// OutOfMemoryError's vtable (the two have the same layout). Without PyTorch, and for every
// other error, a std::runtime_error, which PyTorch reports as RuntimeError.

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

// A constructor of c10::OutOfMemoryError or c10::Error taking (c10::SourceLocation,
// std::string), called as the Itanium C++ ABI calls one: the object first, then the arguments.
using OomConstructor = void (*)(void* self, SourceLocation where, std::string message);

// Room for a c10::OutOfMemoryError (about 150 bytes in PyTorch 2.x): its exact size is not
// needed, only enough.
constexpr std::size_t kOomObjectBytes = 1024;

// Destroys the thrown c10 error through its virtual destructor (std::exception is its first
// and only base, at offset 0).
void destroy_c10_error(void* object) {
  static_cast<std::exception*>(object)->~exception();
}

// The address of `symbol` in the global scope or in an already loaded libc10 or libc10_cuda;
// null where none holds it.
void* c10_symbol(const char* symbol) {
  if (void* address = dlsym(RTLD_DEFAULT, symbol)) {
    return address;
  }
  for (const char* library : {"libc10.so", "libc10_cuda.so"}) {
    void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == nullptr) {
      continue;
    }
    void* address = dlsym(handle, symbol);
    dlclose(handle);  // only the reference RTLD_NOLOAD took: the library stays loaded
    if (address != nullptr) {
      return address;
    }
  }
  return nullptr;
}

// OutOfMemoryError(SourceLocation, std::string) as compilers name an inherited constructor
// (GCC's and Clang's "CI1" form, then the older plain form), then c10::Error's own.
constexpr const char* kOomConstructors[] = {
    "_ZN3c1016OutOfMemoryErrorCI1NS_5ErrorEENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11"
    "char_traitsIcESaIcEEE",
    "_ZN3c1016OutOfMemoryErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_"
    "traitsIcESaIcEEE",
};
constexpr const char* kErrorConstructor =
    "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";

[[noreturn]] void throw_c10_out_of_memory(const char* message) {
  void* type = c10_symbol("_ZTIN3c1016OutOfMemoryErrorE");
  void* constructor = nullptr;
  for (const char* name : kOomConstructors) {
    if ((constructor = c10_symbol(name)) != nullptr) {
      break;
    }
  }
  // Without an OutOfMemoryError constructor: c10::Error's, then OutOfMemoryError's vtable
  // (its address point is two pointers into the vtable object: offset-to-top, typeinfo).
  void* vtable = nullptr;
  if (constructor == nullptr) {
    constructor = c10_symbol(kErrorConstructor);
    vtable = c10_symbol("_ZTVN3c1016OutOfMemoryErrorE");
    if (vtable == nullptr) {
      constructor = nullptr;
    }
  }
  if (type == nullptr || constructor == nullptr) {
    throw std::runtime_error(message);
  }
  void* object = abi::__cxa_allocate_exception(kOomObjectBytes);
  std::memset(object, 0, kOomObjectBytes);
  SourceLocation where{"gpumem_torch_alloc", "gpumem-capi", 0};
  reinterpret_cast<OomConstructor>(constructor)(object, where, std::string(message));
  if (vtable != nullptr) {
    *static_cast<void**>(object) = static_cast<char*>(vtable) + 2 * sizeof(void*);
  }
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
