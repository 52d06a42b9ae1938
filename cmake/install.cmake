# Install rules (cmake --install) and the CMake package: the library and its headers, the CMake
# config and baton.pc (component dev); batond, batonctl, the docs, deploy/ and the systemd unit
# (component runtime). CPack turns the two components into Debian packages (cmake/package.cmake).
include(CMakePackageConfigHelpers)

set(BATON_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/baton")
set(BATON_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "Where the systemd unit goes (relative to the prefix, or absolute)")
set(BATON_CONFIG_DIR "${CMAKE_INSTALL_FULL_SYSCONFDIR}/baton")
# Installed under /usr, the configuration goes to /etc (GNUInstallDirs' full path); anywhere
# else, under the prefix, so that `cmake --install --prefix DIR` stays inside DIR.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(BATON_CONFIG_DESTINATION "${BATON_CONFIG_DIR}")
else()
  set(BATON_CONFIG_DESTINATION "${CMAKE_INSTALL_SYSCONFDIR}/baton")
endif()

# dev: what a program built on baton needs.
install(TARGETS baton EXPORT batonTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT dev)
install(DIRECTORY "${PROJECT_SOURCE_DIR}/framework/include/baton"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}" COMPONENT dev)
install(EXPORT batonTargets NAMESPACE baton:: DESTINATION "${BATON_CMAKE_DIR}" COMPONENT dev)
configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/batonConfig.cmake.in"
                              "${PROJECT_BINARY_DIR}/batonConfig.cmake"
                              INSTALL_DESTINATION "${BATON_CMAKE_DIR}")
# 0.x: a minor release may change the API, so only the same minor version is compatible.
write_basic_package_version_file("${PROJECT_BINARY_DIR}/batonConfigVersion.cmake"
                                 COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/batonConfig.cmake"
              "${PROJECT_BINARY_DIR}/batonConfigVersion.cmake"
        DESTINATION "${BATON_CMAKE_DIR}" COMPONENT dev)
# Relocatable: the prefix is found from where the .pc file is.
file(RELATIVE_PATH BATON_PC_PREFIX "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
string(REGEX REPLACE "/$" "" BATON_PC_PREFIX "${BATON_PC_PREFIX}")
configure_file("${PROJECT_SOURCE_DIR}/cmake/baton.pc.in" "${PROJECT_BINARY_DIR}/baton.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/baton.pc"
        DESTINATION "${CMAKE_INSTALL_LIBDIR}/pkgconfig" COMPONENT dev)

# runtime: the node, the CLI, and what operators deploy with them.
if(BATON_BUILD_TOOLS)
  install(TARGETS batond batonctl RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT runtime)
endif()
install(DIRECTORY "${PROJECT_SOURCE_DIR}/docs/" DESTINATION "${CMAKE_INSTALL_DOCDIR}"
        COMPONENT runtime)
install(FILES "${PROJECT_SOURCE_DIR}/deploy/alerts.yml" "${PROJECT_SOURCE_DIR}/deploy/alerts_test.yml"
              "${PROJECT_SOURCE_DIR}/deploy/prometheus.yml"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/baton" COMPONENT runtime)
install(FILES "${PROJECT_SOURCE_DIR}/deploy/grafana/baton-dashboard.json"
        DESTINATION "${CMAKE_INSTALL_DATADIR}/baton/grafana" COMPONENT runtime)
configure_file("${PROJECT_SOURCE_DIR}/deploy/systemd/batond.service.in"
               "${PROJECT_BINARY_DIR}/batond.service" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/batond.service" DESTINATION "${BATON_SYSTEMD_UNIT_DIR}"
        COMPONENT runtime)
install(FILES "${PROJECT_SOURCE_DIR}/deploy/batond.toml" "${PROJECT_SOURCE_DIR}/deploy/batond.env"
        DESTINATION "${BATON_CONFIG_DESTINATION}" COMPONENT runtime)
foreach(page batond batonctl)
  execute_process(COMMAND gzip -9nc "${PROJECT_SOURCE_DIR}/deploy/man/${page}.1"
                  OUTPUT_FILE "${PROJECT_BINARY_DIR}/${page}.1.gz")
  install(FILES "${PROJECT_BINARY_DIR}/${page}.1.gz" DESTINATION "${CMAKE_INSTALL_MANDIR}/man1"
          COMPONENT runtime)
endforeach()

include("${PROJECT_SOURCE_DIR}/cmake/package.cmake")
