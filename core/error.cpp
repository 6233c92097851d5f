// core/error.cpp — see error.h.
#include "core/error.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <new>
#include <typeinfo>

namespace troupe {

std::string describe_exception(const std::exception& e) {
  if (dynamic_cast<const Error*>(&e)) return e.what();
  if (dynamic_cast<const std::bad_alloc*>(&e))
    return "out of memory (a buffer could not be allocated); lower train.batch_size or train.seq_len, raise "
           "parallel.microbatches, set train.recompute = \"full\", or spread the model over more parallel.pp / tp";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status),
                                              std::free);
  return std::string(status == 0 && name ? name.get() : typeid(e).name()) + ": " + e.what();
}

}  // namespace troupe
