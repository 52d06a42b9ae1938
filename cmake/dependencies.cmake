# baton's dependencies, every one a Debian package (nothing is fetched at build time). The
# package config (cmake/batonConfig.cmake.in) finds the same ones for a consumer.
find_package(Threads REQUIRED)
find_package(Boost 1.81 REQUIRED)  # Asio and Beast, header-only
find_package(spdlog REQUIRED)
find_package(prometheus-cpp REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(CLI11 REQUIRED)
find_package(date REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PQ REQUIRED IMPORTED_TARGET libpq)
pkg_check_modules(PQXX REQUIRED IMPORTED_TARGET libpqxx)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
