# Debian packages with CPack (scripts/package builds them and runs lintian):
#   baton         batond, batonctl, the systemd unit, /etc/baton/batond.{toml,env}, the docs and
#                 deploy/ (alert rules, dashboard, Prometheus config); creates the baton user.
#   libbaton-dev  the headers, libbaton.a, the CMake package and baton.pc.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME baton)
set(CPACK_PACKAGE_VENDOR "The baton developers")
set(CPACK_PACKAGE_CONTACT "The baton developers <baton-dev@baton-jobs.org>")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://baton-jobs.org")
set(CPACK_DEBIAN_COMPRESSION_TYPE xz)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME baton)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_DEPENDS "adduser")
# Descriptions: the synopsis, then the extended text (CPack indents it; an empty line becomes " .").
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "background jobs on a cluster sharing one PostgreSQL database
baton runs background jobs on a cluster of nodes that share one PostgreSQL
database. The nodes elect a leader with a fenced lease; it claims and runs the
jobs, retries failures and keeps an audit trail; a node that dies is replaced
within moments, and a deposed leader never commits twice.

This package has batond (a node), batonctl (the operator's command line), a
systemd unit, alert rules and a Grafana dashboard.")
set(BATON_DEBIAN_DIR "${PROJECT_BINARY_DIR}/debian")
file(MAKE_DIRECTORY "${BATON_DEBIAN_DIR}")
foreach(script postinst prerm postrm)
  configure_file("${PROJECT_SOURCE_DIR}/deploy/debian/${script}" "${BATON_DEBIAN_DIR}/${script}"
                 @ONLY FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                 GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endforeach()
file(WRITE "${BATON_DEBIAN_DIR}/conffiles"
     "${BATON_CONFIG_DIR}/batond.toml\n${BATON_CONFIG_DIR}/batond.env\n")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA
    "${BATON_DEBIAN_DIR}/postinst;${BATON_DEBIAN_DIR}/prerm;${BATON_DEBIAN_DIR}/postrm;${BATON_DEBIAN_DIR}/conffiles")
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libbaton-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
    "libpqxx-dev (>= 6.4), libpq-dev, nlohmann-json3-dev, libspdlog-dev, prometheus-cpp-dev, libhowardhinnant-date-dev, libtomlplusplus-dev, pkg-config")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "background jobs on PostgreSQL - C++20 library and headers
baton runs background jobs on a cluster of nodes that share one PostgreSQL
database: a node binary of your own registers handlers and runs them while it
leads; producers enqueue jobs from any process.

This package has the headers, the static library, the CMake package
(find_package(baton)) and baton.pc.")

# Every package has its copyright file and a compressed changelog, as Debian's policy asks.
execute_process(COMMAND gzip -9nc "${PROJECT_SOURCE_DIR}/deploy/debian/changelog"
                OUTPUT_FILE "${BATON_DEBIAN_DIR}/changelog.Debian.gz")
foreach(pair "runtime;baton" "dev;libbaton-dev")
  list(GET pair 0 component)
  list(GET pair 1 package)
  install(FILES "${PROJECT_SOURCE_DIR}/deploy/debian/copyright"
                "${BATON_DEBIAN_DIR}/changelog.Debian.gz"
          DESTINATION "${CMAKE_INSTALL_DATAROOTDIR}/doc/${package}" COMPONENT ${component})
endforeach()

include(CPack)
