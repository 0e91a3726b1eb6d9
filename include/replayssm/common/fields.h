// Field tables of the params structs: every module exports the name, offset and size of each
// field of its params (recursively through nested structs and arrays of structs), and the
// loader compares them with the ctypes mirrors at load (replayssm/jit/loader.py).
//
// Describe a struct once, next to its definition:
//   REPLAYSSM_DESCRIBE_BEGIN(StatePool) REPLAYSSM_FIELD(state) REPLAYSSM_FIELD(stride_slot) REPLAYSSM_DESCRIBE_END
// listing every field in declaration order (the loader also checks that the fields tile the struct).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace replayssm {

template <class T>
struct Describe {
  static constexpr bool kDescribed = false;
};

#define REPLAYSSM_DESCRIBE_BEGIN(T)          \
  template <>                                \
  struct Describe<T> {                       \
    static constexpr bool kDescribed = true; \
    using Self = T;                          \
    template <class Visitor>                 \
    static void visit(Visitor&& v) {
#define REPLAYSSM_FIELD(F)                            \
  v(#F, offsetof(Self, F), sizeof(decltype(Self::F)), \
    static_cast<std::remove_reference_t<decltype(Self::F)>*>(nullptr));
#define REPLAYSSM_DESCRIBE_END \
  }                            \
  }                            \
  ;

struct FieldRow {
  std::string name;  // dotted path: "d.in.x", "arrays[2].ptr"
  int64_t offset;    // from the start of the outermost struct
  int64_t size;
};

// Appends the leaf fields of T (at `base`, names prefixed by `prefix`) to `out`.
template <class T>
void flatten_fields(std::vector<FieldRow>& out, const std::string& prefix, int64_t base) {
  Describe<T>::visit([&](const char* name, size_t off, size_t size, auto* tag) {
    using FT = std::remove_pointer_t<decltype(tag)>;
    const std::string path = prefix + name;
    const int64_t at = base + static_cast<int64_t>(off);
    if constexpr (std::is_array_v<FT>) {
      using E = std::remove_all_extents_t<FT>;
      if constexpr (Describe<E>::kDescribed && std::rank_v<FT> == 1) {
        for (size_t i = 0; i < std::extent_v<FT>; ++i)
          flatten_fields<E>(out, path + "[" + std::to_string(i) + "].", at + static_cast<int64_t>(i * sizeof(E)));
      } else {
        out.push_back({path, at, static_cast<int64_t>(size)});
      }
    } else if constexpr (Describe<FT>::kDescribed) {
      flatten_fields<FT>(out, path + ".", at);
    } else {
      out.push_back({path, at, static_cast<int64_t>(size)});
    }
  });
}

// The (static) flattened table of T.
template <class T>
const std::vector<FieldRow>& field_table() {
  static const std::vector<FieldRow> table = [] {
    std::vector<FieldRow> t;
    flatten_fields<T>(t, "", 0);
    return t;
  }();
  return table;
}

}  // namespace replayssm
