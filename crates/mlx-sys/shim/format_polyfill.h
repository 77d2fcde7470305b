// Flashbar: mlx-c calls std::format (C++20) without including <format>; g++ 12
// (Debian 12) ships no <format> at all. Force-included by build/linux.rs: uses
// the real one when present, else a minimal version for mlx-c's messages,
// which only use plain "{}" fields.
#pragma once
#if __has_include(<format>)
#include <format>
#endif

#ifndef __cpp_lib_format
#include <sstream>
#include <string>
#include <string_view>

namespace std {
namespace flashbar_format {
inline void write(ostringstream& out, string_view pattern) { out << pattern; }

template <class First, class... Rest>
void write(ostringstream& out, string_view pattern, const First& first, const Rest&... rest) {
  auto field = pattern.find("{}");
  if (field == string_view::npos) {
    out << pattern;
    return;
  }
  out << pattern.substr(0, field) << first;
  write(out, pattern.substr(field + 2), rest...);
}
}  // namespace flashbar_format

template <class... Args>
string format(string_view pattern, const Args&... args) {
  ostringstream out;
  flashbar_format::write(out, pattern, args...);
  return out.str();
}
}  // namespace std
#endif
