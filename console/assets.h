// The console's pages, scripts and styles, embedded in the binary at build time
// (cmake/embed_assets.cmake): no file is read from disk and nothing is fetched from a network.
#pragma once

#include <string_view>

namespace baton::console {

struct Asset {
  std::string_view path;  // "/index.html", "/app.js", ...
  std::string_view content_type;
  std::string_view body;
};

// The asset at `path`, or nullptr.
const Asset* find_asset(std::string_view path);

}  // namespace baton::console
