# Turns the console's files (console/assets/*) into a C++ source holding their bytes, so that a
# node serves its pages with nothing read from disk or fetched from the network. Runs at build
# time (see console/CMakeLists.txt). Bytes rather than string literals: no file content can end
# a literal early, and no literal length limit applies.
file(GLOB files "${ASSET_DIR}/*")
list(SORT files)
set(arrays "")
set(table "")
set(index 0)
foreach(f IN LISTS files)
  get_filename_component(name "${f}" NAME)
  get_filename_component(ext "${f}" LAST_EXT)
  if(ext STREQUAL ".html")
    set(type "text/html; charset=utf-8")
  elseif(ext STREQUAL ".js")
    set(type "text/javascript; charset=utf-8")
  elseif(ext STREQUAL ".css")
    set(type "text/css; charset=utf-8")
  elseif(ext STREQUAL ".svg")
    set(type "image/svg+xml")
  elseif(ext STREQUAL ".png")
    set(type "image/png")
  else()
    message(FATAL_ERROR "embed_assets: no content type for ${name}")
  endif()
  file(READ "${f}" hex HEX)
  string(LENGTH "${hex}" hex_length)
  math(EXPR size "${hex_length} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){24})" "\\1\n    " bytes "${bytes}")
  string(APPEND arrays "const unsigned char asset_${index}[] = {\n    ${bytes}0x00};\n")
  string(APPEND table
    "    {\"/${name}\", \"${type}\", std::string_view(reinterpret_cast<const char*>(asset_${index}), ${size})},\n")
  math(EXPR index "${index} + 1")
endforeach()
file(WRITE "${OUT}.tmp"
"// Generated from console/assets/* by cmake/embed_assets.cmake. Do not edit.\n"
"#include \"console/assets.h\"\n\n"
"#include <array>\n\n"
"namespace baton::console {\n"
"namespace {\n\n"
"// NOLINTBEGIN\n${arrays}// NOLINTEND\n\n"
"const Asset kAssets[] = {\n${table}};\n\n"
"}  // namespace\n\n"
"const Asset* find_asset(std::string_view path) {\n"
"  for (const auto& a : kAssets) {\n"
"    if (a.path == path) return &a;\n"
"  }\n"
"  return nullptr;\n"
"}\n\n"
"}  // namespace baton::console\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
